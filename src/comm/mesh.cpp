// The rank mesh (mesh.h): Megatron-core's rank arithmetic, then one MPI_Comm_split per group.
//
// Steps of mesh_groups (Megatron's generate_masked_orthogonal_rank_groups): the world index w decomposes into one
// coordinate per dimension with strides = prefix products of the sizes (innermost first). For a mask, the masked
// dimensions index the ranks inside a group and the unmasked ones index the groups: group g, member i is
// inner(decompose(i, masked sizes), masked strides) + inner(decompose(g, unmasked sizes), unmasked strides).
#include "coc/comm/mesh.h"

#include <fmt/format.h>

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

}  // namespace

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
    for (int i = 0; i < group_size; ++i) out[static_cast<size_t>(g)].push_back(base + inner(decompose(i, in_shape), in_stride));
  }
  return out;
}

int mesh_dense_dp(int world, const MeshSizes& s) {
  if (s.tp < 1) throw_invalid("--tensor-model-parallel-size must be >= 1 (got {})", s.tp);
  if (s.cp < 1) throw_invalid("--context-parallel-size must be >= 1 (got {})", s.cp);
  if (s.ep < 1) throw_invalid("--expert-model-parallel-size must be >= 1 (got {})", s.ep);
  const int model = s.tp * s.cp;
  if (world % model != 0) {
    // Name cp only when it is in play: most runs set tp alone.
    const std::string sizes = s.cp == 1 ? fmt::format("--tensor-model-parallel-size {}", s.tp)
                                        : fmt::format("--tensor-model-parallel-size {} × --context-parallel-size "
                                                      "{} = {} (the layout is world = tp × cp × dp)",
                                                      s.tp, s.cp, model);
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

MeshCoords mesh_coords(int world, const MeshSizes& s, int w) {
  const int dp = world / (s.tp * s.cp);
  const std::vector<int> dense = decompose(w, {s.tp, s.cp, dp});
  const std::vector<int> expert = decompose(w, {s.tp, s.ep, world / (s.tp * s.ep)});
  return {dense[0], dense[1], dense[2], expert[1], expert[2]};
}

std::string Mesh::describe() const {
  return fmt::format("tp {}/{}, cp {}/{}, dp {}/{}, ep {}/{}, expert-dp {}/{}", coords.tp, sizes.tp, coords.cp,
                     sizes.cp, coords.dp, dp_size_, coords.ep, sizes.ep, coords.expert_dp, expert_dp_size_);
}

Mesh make_mesh(const MeshSizes& sizes, const CommOptions& opts) {
  const int world_size = coc::world_size(), world_rank = coc::world_rank();
  Mesh m;
  m.sizes = sizes;
  m.dp_size_ = mesh_dense_dp(world_size, sizes);
  m.expert_dp_size_ = world_size / (sizes.tp * sizes.ep);
  m.coords = mesh_coords(world_size, sizes, world_rank);
  auto engine = std::make_shared<ProgressEngine>(opts.engine, opts.poll_us);
  m.world = Communicator::world("world", engine, opts);
  const std::vector<int> dense{sizes.tp, sizes.cp, m.dp_size_};
  const std::vector<int> expert{sizes.tp, sizes.ep, m.expert_dp_size_};
  // Every rank is in exactly one group of a mask: split by the index of that group, ordered by the position in it.
  const auto make = [&](const std::vector<int>& view, std::vector<bool> mask, const char* name) {
    const std::vector<std::vector<int>> groups = mesh_groups(view, mask);
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].size(); ++i)
        if (groups[g][i] == world_rank) return m.world->split(static_cast<int>(g), static_cast<int>(i), name);
    throw_error(ErrorKind::kInternal, "rank {} is in no '{}' group of the mesh", world_rank, name);
  };
  m.tp = make(dense, {true, false, false}, "tp");
  m.cp = make(dense, {false, true, false}, "cp");
  m.dp = make(dense, {false, false, true}, "dp");
  m.dp_cp = make(dense, {false, true, true}, "dp-cp");
  m.model_parallel = make(dense, {true, false, false}, "model-parallel");
  m.ep = make(expert, {false, true, false}, "ep");
  m.expert_dp = make(expert, {false, false, true}, "expert-dp");
  m.expert_model_parallel = make(expert, {true, true, false}, "expert-model-parallel");
  return m;
}

}  // namespace coc
