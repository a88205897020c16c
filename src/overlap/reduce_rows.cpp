// Row collectives without a GEMM (coc_ops.h: all_reduce_rows, reduce_scatter_rows, all_gather_rows) and the
// rank-ordered sum behind every deterministic reduction. They follow the CoC ops' conventions: rank r's share of m
// rows is split_rows(m, T, r), rows are rank-major, and the deterministic option sums in rank order
// (docs/design.md, "Deterministic mode"). Used by layers for un-chunked communication, e.g. the vocab-parallel
// embedding (Megatron: mappings.py reduce_from/_reduce_scatter_along_first_dim/_gather_along_first_dim).
#include <fmt/format.h>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc {

using namespace detail;

namespace detail {

void sum_in_rank_order(const float* parts, int T, int64_t part_stride, MatrixView out) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "sum_partials", {"rows", out.rows}, {"cols", out.cols}, {"parts", T});
  const int64_t cols = out.cols;
  for (int64_t i = 0; i < out.rows; ++i) {
    float* y = out.row(i);
    const float* p0 = parts + i * cols;
    for (int64_t j = 0; j < cols; ++j) y[j] = p0[j];
    // One rank at a time over the whole row: each element still sees the additions in rank order, and the inner
    // loop stays a plain vectorisable add (no reassociation: we never build with -ffast-math).
    for (int r = 1; r < T; ++r) {
      const float* p = parts + r * part_stride + i * cols;
      for (int64_t j = 0; j < cols; ++j) y[j] += p[j];
    }
  }
}

void sum16_in_rank_order(const BFloat16* parts, int T, int64_t part_stride, MatrixView out) {
  Scratch wide = make_scratch(T * part_stride);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "bf16_to_fp32", {"elements", T * part_stride});
  bf16_to_fp32(parts, wide.get(), T * part_stride);
  sum_in_rank_order(wide.get(), T, part_stride, out);
  for (int64_t i = 0; i < out.rows; ++i) round_to_bf16(out.row(i), out.cols);
}

Work all_gather_then_sum(Communicator& group, const float* src, MatrixView out, Scratch keep, const std::string& tag,
                         DType wire) {
  const int T = group.size();
  const int64_t count = out.rows * out.cols;
  std::vector<int64_t> counts(static_cast<size_t>(T), count), displs(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) displs[static_cast<size_t>(r)] = r * count;
  if (wire == DType::kBF16) {
    // Rounded once into staging; the sum widens into a reused fp32 scratch, so its bits are sum_in_rank_order's
    // of the rounded partials whatever moved them.
    Scratch mine = make_scratch16(count), parts = make_scratch16(T * count);
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", count});
      fp32_to_bf16(src, as16(mine), count);
    }
    keep.reset();  // src is read: the caller's scratch may go back to the pool
    Work w = group.all_gather(as16(mine), as16(parts), counts, displs, tag);
    return w.then([mine, parts, T, count, out]() mutable {
      sum16_in_rank_order(as16(parts), T, count, out);
      parts.reset();
      mine.reset();
    });
  }
  Scratch parts = make_scratch(T * count);
  Work w = group.all_gather(src, parts.get(), counts, displs, tag);
  return w.then([keep, parts, T, count, out]() mutable {
    sum_in_rank_order(parts.get(), T, count, out);
    parts.reset();  // the flight recorder keeps finished ops; do not let it pin the scratches
    keep.reset();
  });
}

}  // namespace detail

namespace {
std::string label_of(const char* op, const std::string& tag, int rank) {
  return tag.empty() ? fmt::format("{} (rank {})", op, rank) : fmt::format("{} '{}' (rank {})", op, tag, rank);
}

void check_wire(const char* op, const std::string& tag, int rank, DType wire) {
  if (wire != DType::kF32 && wire != DType::kBF16)
    throw Error(ErrorKind::kInvalidArgument,
                label_of(op, tag, rank) + fmt::format(": wire type {} is not built; use fp32 or bf16", to_string(wire)),
                true);
}

/// The rank-major layout of a reduce-scatter of x [m, c] over T ranks: rank r's rows split_rows(m, T, r) are sent
/// to r (sc, sd: element counts and offsets in x); this rank's share of cnt elements arrives from every rank into
/// a [T, cnt] block (rc, rd).
struct RankMajor {
  std::vector<int64_t> sc, sd, rc, rd;
  int64_t cnt;
  RankMajor(int64_t m, int64_t c, int T, int me) : cnt(split_rows(m, T, me).count * c) {
    for (int r = 0; r < T; ++r) {
      const RowRange s = split_rows(m, T, r);
      sc.push_back(s.count * c);
      sd.push_back(s.begin * c);
      rc.push_back(cnt);
      rd.push_back(r * cnt);
    }
  }
};

/// reduce_scatter_rows over a bf16 wire: x rounded into bf16 staging, then MPI's 16-bit reduce-scatter, or in
/// deterministic mode a bf16 all-to-all whose widened partials are summed in rank order and rounded once.
Work reduce_scatter_rows16(Communicator& group, ConstMatrixView x, MatrixView out, bool deterministic,
                           const std::string& tag, const RankMajor& lay) {
  const int T = group.size();
  Scratch send = make_scratch16(x.rows * x.cols);
  to_wire(x, as16(send));
  if (!deterministic) {
    Scratch recv = make_scratch16(lay.cnt);
    return group.reduce_scatter(as16(send), as16(recv), lay.sc, tag).then([send, recv, out]() mutable {
      from_wire(as16(recv), out);
      recv.reset();
      send.reset();
    });
  }
  Scratch parts = make_scratch16(T * lay.cnt);
  Work w = group.all_to_all(as16(send), lay.sc, lay.sd, as16(parts), lay.rc, lay.rd, tag);
  return w.then([send, parts, T, cnt = lay.cnt, out]() mutable {
    sum16_in_rank_order(as16(parts), T, cnt, out);
    parts.reset();
    send.reset();
  });
}

// A dense copy of x (or x itself when already dense), for use as an MPI send buffer.
const float* dense_source(ConstMatrixView x, Scratch& keep) {
  if (is_contiguous(x)) return x.data;
  keep = make_scratch(x.rows * x.cols);
  copy_rows(x, dense(keep.get(), x.rows, x.cols));
  return keep.get();
}
}  // namespace

Work all_reduce_rows(Communicator& group, MatrixView x, bool deterministic, const std::string& tag, DType wire) {
  const char* op = "all_reduce_rows";
  if (std::string e = check_view(x, "x"); !e.empty())
    throw Error(ErrorKind::kInvalidArgument, label_of(op, tag, group.rank()) + ": " + e, true);
  check_wire(op, tag, group.rank(), wire);
  const int T = group.size();
  if (T == 1) return Work();
  const int64_t count = x.rows * x.cols;
  if (wire == DType::kBF16 && !deterministic) {
    Scratch w16 = make_scratch16(count);
    to_wire(x, as16(w16));
    return group.all_reduce(as16(w16), count, ReduceOp::kSum, tag).then([w16, x]() mutable {
      from_wire(as16(w16), x);
      w16.reset();
    });
  }
  Scratch src_buf;
  const float* src = dense_source(x, src_buf);
  if (wire == DType::kBF16) return all_gather_then_sum(group, src, x, src_buf, tag, wire);
  if (!deterministic) {
    if (!src_buf) return group.all_reduce(x.data, count, ReduceOp::kSum, tag);
    float* buf = src_buf.get();
    Work w = group.all_reduce(buf, count, ReduceOp::kSum, tag);
    return w.then([src_buf, x]() mutable {
      copy_rows(dense(src_buf.get(), x.rows, x.cols), x);
      src_buf.reset();
    });
  }
  return all_gather_then_sum(group, src, x, src_buf, tag);
}

Work reduce_scatter_rows(Communicator& group, ConstMatrixView x, MatrixView out, bool deterministic,
                         const std::string& tag, DType wire) {
  const char* op = "reduce_scatter_rows";
  const int T = group.size(), me = group.rank();
  std::string e = check_view(x, "x");
  if (e.empty()) e = check_view(out, "out");
  const RowRange share = split_rows(std::max<int64_t>(x.rows, 0), T, me);
  if (e.empty() && (out.rows != share.count || out.cols != x.cols))
    e = fmt::format("out is [{}, {}] but rank {}'s share of x [{}, {}] over tp={} is [{}, {}] (split_rows: the "
                    "first m mod tp ranks get one extra row)",
                    out.rows, out.cols, me, x.rows, x.cols, T, share.count, x.cols);
  if (e.empty() && overlaps(x, out)) e = "out overlaps x; use a separate output buffer";
  if (!e.empty()) throw Error(ErrorKind::kInvalidArgument, label_of(op, tag, me) + ": " + e, true);
  check_wire(op, tag, me, wire);
  if (T == 1) {
    copy_rows(x, out);
    return Work();
  }
  const RankMajor lay(x.rows, x.cols, T, me);
  if (wire == DType::kBF16) return reduce_scatter_rows16(group, x, out, deterministic, tag, lay);
  Scratch src_buf;
  const float* src = dense_source(x, src_buf);
  if (!deterministic) {
    if (is_contiguous(out))
      return group.reduce_scatter(src, out.data, lay.sc, tag).then([src_buf]() mutable { src_buf.reset(); });
    Scratch recv = make_scratch(lay.cnt);
    return group.reduce_scatter(src, recv.get(), lay.sc, tag).then([src_buf, recv, out]() mutable {
      copy_rows(dense(recv.get(), out.rows, out.cols), out);
      recv.reset();
      src_buf.reset();
    });
  }
  Scratch parts = make_scratch(T * lay.cnt);
  Work w = group.all_to_all(src, lay.sc, lay.sd, parts.get(), lay.rc, lay.rd, tag);
  return w.then([src_buf, parts, T, cnt = lay.cnt, out]() mutable {
    sum_in_rank_order(parts.get(), T, cnt, out);
    parts.reset();
    src_buf.reset();
  });
}

Work all_gather_rows(Communicator& group, ConstMatrixView x, MatrixView out, const std::string& tag, DType wire) {
  const char* op = "all_gather_rows";
  const int T = group.size(), me = group.rank();
  std::string e = check_view(x, "x");
  if (e.empty()) e = check_view(out, "out");
  const RowRange share = split_rows(std::max<int64_t>(out.rows, 0), T, me);
  if (e.empty() && (x.rows != share.count || x.cols != out.cols))
    e = fmt::format("x is [{}, {}] but rank {}'s share of out [{}, {}] over tp={} is [{}, {}] (split_rows: the "
                    "first m mod tp ranks get one extra row)",
                    x.rows, x.cols, me, out.rows, out.cols, T, share.count, out.cols);
  if (!e.empty()) throw Error(ErrorKind::kInvalidArgument, label_of(op, tag, me) + ": " + e, true);
  check_wire(op, tag, me, wire);
  const int64_t m = out.rows, c = out.cols;
  if (T == 1) {
    copy_rows(x, out);
    return Work();
  }
  const RankMajor lay(m, c, T, me);  // sc, sd: every rank's count and place in out
  if (wire == DType::kBF16) {
    Scratch send = make_scratch16(x.rows * c), recv = make_scratch16(m * c);
    to_wire(x, as16(send));
    return group.all_gather(as16(send), as16(recv), lay.sc, lay.sd, tag).then([send, recv, out]() mutable {
      from_wire(as16(recv), out);
      recv.reset();
      send.reset();
    });
  }
  Scratch src_buf;
  const float* src = x.data;
  if (!is_contiguous(x) || overlaps(x, out)) {  // MPI's send and receive buffers must not alias
    src_buf = make_scratch(x.rows * c);
    copy_rows(x, dense(src_buf.get(), x.rows, c));
    src = src_buf.get();
  }
  if (is_contiguous(out))
    return group.all_gather(src, out.data, lay.sc, lay.sd, tag).then([src_buf]() mutable { src_buf.reset(); });
  Scratch recv = make_scratch(m * c);
  return group.all_gather(src, recv.get(), lay.sc, lay.sd, tag).then([src_buf, recv, out]() mutable {
    copy_rows(dense(recv.get(), out.rows, out.cols), out);
    recv.reset();
    src_buf.reset();
  });
}

}  // namespace coc
