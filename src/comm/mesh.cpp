// The rank mesh (mesh.h): Megatron-core's rank arithmetic, then one MPI_Comm_split per row of the group table.
//
// Steps of mesh_groups (Megatron's generate_masked_orthogonal_rank_groups): the world index w decomposes into one
// coordinate per dimension with strides = prefix products of the sizes (innermost first). For a mask, the masked
// dimensions index the ranks inside a group and the unmasked ones index the groups: group g, member i is
// inner(decompose(i, masked sizes), masked strides) + inner(decompose(g, unmasked sizes), unmasked strides).
#include "coc/comm/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "coc/comm/process.h"
#include "coc/core/error.h"

namespace coc {

namespace {

std::vector<int> prefix_product(const std::vector<int>& a) {
  std::vector<int> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}

std::vector<int> decompose(int index, const std::vector<int>& shape) {
  std::vector<int> idx;
  for (int s : shape) {
    idx.push_back(index % s);
    index /= s;
  }
  return idx;
}

int inner(const std::vector<int>& a, const std::vector<int>& b) {
  int s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

bool has(const std::vector<MeshDim>& dims, MeshDim d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); }

/// Megatron's token of `d` in an order string: expert-dp is the expert view's "dp".
const char* token(MeshDim d) { return d == MeshDim::kExpertDp ? "dp" : to_string(d); }

/// The view of `order` without `dropped`, with `dp_as` in dp's place, sized from `size_of`.
template <typename SizeOf>
MeshView view_of(const std::vector<MeshDim>& order, MeshDim dropped, MeshDim dp_as, SizeOf size_of) {
  MeshView v;
  for (MeshDim d : order) {
    if (d == dropped) continue;
    const MeshDim mine = d == MeshDim::kDp ? dp_as : d;
    v.dims.push_back(mine);
    v.sizes.push_back(size_of(mine));
  }
  return v;
}

MeshCoords coords_in(const MeshLayout& l, int w) {
  return {.tp = l.dense.coord(w, MeshDim::kTp),
          .cp = l.dense.coord(w, MeshDim::kCp),
          .dp = l.dense.coord(w, MeshDim::kDp),
          .pp = l.dense.coord(w, MeshDim::kPp),
          .ep = l.expert.coord(w, MeshDim::kEp),
          .expert_dp = l.expert.coord(w, MeshDim::kExpertDp)};
}

}  // namespace

const char* to_string(MeshDim d) {
  switch (d) {
    case MeshDim::kTp: return "tp";
    case MeshDim::kCp: return "cp";
    case MeshDim::kEp: return "ep";
    case MeshDim::kDp: return "dp";
    case MeshDim::kExpertDp: return "expert-dp";
    case MeshDim::kPp: return "pp";
  }
  return "?";
}

std::vector<MeshDim> parse_mesh_order(std::string_view order) {
  constexpr MeshDim kTokens[] = {MeshDim::kTp, MeshDim::kCp, MeshDim::kEp, MeshDim::kDp, MeshDim::kPp};
  std::vector<MeshDim> dims;
  for (size_t start = 0; start <= order.size();) {
    const size_t end = std::min(order.find('-', start), order.size());
    const std::string_view tok = order.substr(start, end - start);
    const auto* d = std::find_if(std::begin(kTokens), std::end(kTokens), [&](MeshDim t) { return tok == token(t); });
    if (d == std::end(kTokens))
      throw_invalid("unknown dimension '{}' in the parallel order '{}'; the tokens are tp, cp, ep, dp and pp, "
                    "innermost first (Megatron's order, e.g. \"{}\")",
                    tok, order, kMeshOrder);
    if (has(dims, *d)) throw_invalid("dimension '{}' appears twice in the parallel order '{}'", tok, order);
    dims.push_back(*d);
    start = end + 1;
  }
  for (MeshDim t : kTokens)
    if (!has(dims, t))
      throw_invalid("the parallel order '{}' lacks '{}'; name each of tp, cp, ep, dp and pp once, e.g. \"{}\"",
                    order, token(t), kMeshOrder);
  // cp, ep and dp adjacent: their positions span three consecutive slots.
  std::vector<size_t> at;
  for (MeshDim t : {MeshDim::kCp, MeshDim::kEp, MeshDim::kDp})
    at.push_back(static_cast<size_t>(std::find(dims.begin(), dims.end(), t) - dims.begin()));
  if (*std::max_element(at.begin(), at.end()) - *std::min_element(at.begin(), at.end()) != 2)
    throw_invalid("the parallel order '{}' separates cp, ep and dp; keep them adjacent (expert parallelism "
                  "subdivides the data- and context-parallel ranks), e.g. \"{}\"",
                  order, kMeshOrder);
  return dims;
}

std::string MeshView::order() const {
  std::string s;
  for (MeshDim d : dims) s += (s.empty() ? "" : "-") + std::string(token(d));
  return s;
}

int MeshView::size(MeshDim d) const {
  const auto it = std::find(dims.begin(), dims.end(), d);
  return it == dims.end() ? 1 : sizes[static_cast<size_t>(it - dims.begin())];
}

int MeshView::coord(int w, MeshDim d) const {
  const auto it = std::find(dims.begin(), dims.end(), d);
  return it == dims.end() ? 0 : decompose(w, sizes)[static_cast<size_t>(it - dims.begin())];
}

std::vector<std::vector<int>> MeshView::groups(const std::vector<MeshDim>& of) const {
  for (MeshDim d : of)
    if (!has(dims, d)) throw_error(ErrorKind::kInternal, "the view '{}' has no dimension '{}'", order(), to_string(d));
  std::vector<bool> mask;
  for (MeshDim d : dims) mask.push_back(has(of, d));
  return mesh_groups(sizes, mask);
}

std::vector<std::vector<int>> MeshLayout::groups(const std::vector<MeshDim>& of) const {
  return (has(of, MeshDim::kEp) || has(of, MeshDim::kExpertDp) ? expert : dense).groups(of);
}

MeshLayout mesh_layout(int world, const MeshSizes& s, std::string_view order) {
  const int dp = mesh_dense_dp(world, s);
  const std::vector<MeshDim> dims = parse_mesh_order(order);
  const auto size_of = [&](MeshDim d) {
    switch (d) {
      case MeshDim::kTp: return s.tp;
      case MeshDim::kCp: return s.cp;
      case MeshDim::kEp: return s.ep;
      case MeshDim::kDp: return dp;
      case MeshDim::kExpertDp: return world / (s.tp * s.ep * s.pp);
      case MeshDim::kPp: return s.pp;
    }
    return 1;
  };
  return {view_of(dims, MeshDim::kEp, MeshDim::kDp, size_of),
          view_of(dims, MeshDim::kCp, MeshDim::kExpertDp, size_of)};
}

std::vector<std::vector<int>> mesh_groups(const std::vector<int>& sizes, const std::vector<bool>& mask) {
  const std::vector<int> stride = prefix_product(sizes);
  std::vector<int> in_shape, in_stride, out_shape, out_stride;
  for (size_t d = 0; d < sizes.size(); ++d) {
    (mask[d] ? in_shape : out_shape).push_back(sizes[d]);
    (mask[d] ? in_stride : out_stride).push_back(stride[d]);
  }
  const int group_size = prefix_product(in_shape).back(), groups = prefix_product(out_shape).back();
  std::vector<std::vector<int>> out(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    const int base = inner(decompose(g, out_shape), out_stride);
    for (int i = 0; i < group_size; ++i)
      out[static_cast<size_t>(g)].push_back(base + inner(decompose(i, in_shape), in_stride));
  }
  return out;
}

int mesh_dense_dp(int world, const MeshSizes& s) {
  if (s.tp < 1) throw_invalid("--tensor-model-parallel-size must be >= 1 (got {})", s.tp);
  if (s.cp < 1) throw_invalid("--context-parallel-size must be >= 1 (got {})", s.cp);
  if (s.ep < 1) throw_invalid("--expert-model-parallel-size must be >= 1 (got {})", s.ep);
  if (s.pp < 1) throw_invalid("--pipeline-model-parallel-size must be >= 1 (got {})", s.pp);
  const int model = s.tp * s.cp * s.pp;
  if (world % model != 0) {
    // Name cp and pp only when they are in play: most runs set tp alone.
    std::string sizes = fmt::format("--tensor-model-parallel-size {}", s.tp), layout = "tp × cp";
    if (s.cp > 1) sizes += fmt::format(" × --context-parallel-size {}", s.cp);
    if (s.pp > 1) {
      sizes += fmt::format(" × --pipeline-model-parallel-size {}", s.pp);
      layout += " × pp";
    }
    if (model != s.tp) sizes += fmt::format(" = {} (the layout is world = {} × dp)", model, layout);
    throw_invalid("world size {} is not divisible by {}; launch a multiple of {} ranks (scripts/launch -n {} -- ...) "
                  "or change the sizes",
                  world, sizes, model, ((world + model - 1) / model) * model);
  }
  const int dp = world / model;
  if ((dp * s.cp) % s.ep != 0)
    throw_invalid("--expert-model-parallel-size {} does not divide dp × cp = {} × {} = {} (expert parallelism "
                  "subdivides the data- and context-parallel ranks: world = tp × ep × expert-dp); choose an ep that "
                  "divides {}",
                  s.ep, dp, s.cp, dp * s.cp, dp * s.cp);
  return dp;
}

MeshCoords mesh_coords(int world, const MeshSizes& s, int w) { return coords_in(mesh_layout(world, s), w); }

const std::vector<GroupSpec>& process_group_table() {
  using D = MeshDim;
  using G = GroupName;
  using P = ProcessGroups;
  // Megatron's get_ranks tokens per group (parallel_state.py); the order is the order of the splits, which every
  // rank must share (pp last: it came after the others).
  static const std::vector<GroupSpec> table = {
      {G::kWorld, "world", {D::kTp, D::kCp, D::kDp, D::kPp}, &P::world},
      {G::kTp, "tp", {D::kTp}, &P::tp},
      {G::kCp, "cp", {D::kCp}, &P::cp},
      {G::kDp, "dp", {D::kDp}, &P::dp},
      {G::kDpCp, "dp-cp", {D::kCp, D::kDp}, &P::dp_cp},
      {G::kModelParallel, "model-parallel", {D::kTp, D::kPp}, &P::model_parallel},
      {G::kEp, "ep", {D::kEp}, &P::ep},
      {G::kExpertDp, "expert-dp", {D::kExpertDp}, &P::expert_dp},
      {G::kExpertModelParallel, "expert-model-parallel", {D::kTp, D::kEp, D::kPp}, &P::expert_model_parallel},
      {G::kPp, "pp", {D::kPp}, &P::pp},
  };
  return table;
}

Communicator& ProcessGroups::group(GroupName g) {
  const std::vector<GroupSpec>& table = process_group_table();
  const auto spec = std::find_if(table.begin(), table.end(), [&](const GroupSpec& s) { return s.group == g; });
  COC_ASSERT(spec != table.end() && this->*spec->member, "the process groups have no '{}' group (built by make_mesh?)",
             spec == table.end() ? "?" : spec->name);
  return *(this->*spec->member);
}

std::string ProcessGroups::describe() const {
  std::string s;
  const auto add = [&](const MeshView& v, MeshDim d) {
    s += fmt::format("{}{} {}/{}", s.empty() ? "" : ", ", to_string(d), v.coord(world->rank(), d), v.size(d));
  };
  for (MeshDim d : layout.dense.dims) add(layout.dense, d);
  for (MeshDim d : layout.expert.dims)
    if (!has(layout.dense.dims, d)) add(layout.expert, d);
  return s;
}

ProcessGroups make_mesh(const MeshSizes& sizes, const CommOptions& opts) {
  const int world_size = coc::world_size(), world_rank = coc::world_rank();
  ProcessGroups m;
  m.sizes = sizes;
  m.layout = mesh_layout(world_size, sizes);
  m.dp_size_ = m.layout.dense.size(MeshDim::kDp);
  m.expert_dp_size_ = m.layout.expert.size(MeshDim::kExpertDp);
  m.coords = coords_in(m.layout, world_rank);
  auto engine = std::make_shared<ProgressEngine>(opts.engine, opts.poll_us);
  m.world = Communicator::world("world", engine, opts);
  // Every rank is in exactly one group of a row: split by the index of that group, ordered by the position in it.
  for (const GroupSpec& spec : process_group_table()) {
    if (m.*spec.member) continue;  // the world: MPI_COMM_WORLD itself
    const std::vector<std::vector<int>> groups = m.layout.groups(spec.dims);
    for (size_t g = 0; g < groups.size() && !(m.*spec.member); ++g) {
      const auto at = std::find(groups[g].begin(), groups[g].end(), world_rank);
      if (at != groups[g].end())
        m.*spec.member = m.world->split(static_cast<int>(g), static_cast<int>(at - groups[g].begin()), spec.name);
    }
    if (!(m.*spec.member))
      throw_error(ErrorKind::kInternal, "rank {} is in no '{}' group of the mesh", world_rank, spec.name);
  }
  return m;
}

}  // namespace coc
