// w8a16 matmul_all_reduce (w8a16.h): matmul_all_reduce's compute-first pipeline with the int8-weight panel GEMM
// in place of sgemm. torch_npu: npu_mm_all_reduce_base(x1, x2_int8, antiquant_scale, antiquant_offset,
// antiquant_group_size); the chunking and in-place all-reduce follow src/overlap/matmul_all_reduce.cpp.
#include <fmt/format.h>

#include <optional>

#include "coc/core/error.h"
#include "coc/overlap/w8a16.h"
#include "coc_internal.h"

namespace coc {

using namespace detail;

namespace {
constexpr const char* kOp = "w8a16_matmul_all_reduce";

std::string validate(const ActivationView& a, const Int8Weight& w, ConstMatrixView out, const CocOptions& opts) {
  if (std::string e = check_options(opts); !e.empty()) return e;
  try {
    w.validate("the int8 weight");
  } catch (const Error& e) {
    return e.what();
  }
  if (std::string e = check_activation(a, w.k); !e.empty()) return e;
  if (std::string e = check_view(out, "out"); !e.empty()) return e;
  if (out.rows != a.rows || out.cols != w.n)
    return fmt::format("out is [{}, {}] but a [{}, {}] · w [{}, {}] is [{}, {}]; allocate out as [m, n] (every rank "
                       "gets the full reduced result)",
                       out.rows, out.cols, a.rows, a.cols, w.k, w.n, a.rows, w.n);
  return {};
}
}  // namespace

CocPending w8a16_matmul_all_reduce_async(Communicator& group, ActivationView a, const Int8Weight& w, MatrixView out,
                                         const float* bias, const CocOptions& opts, const W8GemmOptions& gemm) {
  const int T = group.size();
  const std::string label = op_label(kOp, opts, group.rank());
  const int64_t m = a.rows, k = w.k, n = w.n;
  {
    const int64_t key[] = {7, m, n, opts.parallel_num, opts.min_chunk_rows, opts.deterministic ? 1 : 0,
                           opts.fused ? 1 : 0};
    agree_on_arguments(group, label, validate(a, w, out, opts), key,
                       fmt::format("this rank: m={} n={} N={} fused={}", m, n, opts.parallel_num, opts.fused));
  }
  if (opts.fused && T > 1) {
    produce(opts, {0, m});  // widened below, whole
    // The fused kernel's tiles read an fp32 weight: dequantise once for this call (transient k·n·4 bytes) and
    // hand the fp32 problem to the fused op; 16-bit activations are widened the same way.
    auto wd = std::make_shared<Tensor>(dequantize(w));
    std::shared_ptr<Tensor> af;
    ConstMatrixView av;
    if (a.dtype == DType::kF32) {
      av = {static_cast<const float*>(a.data), a.rows, a.cols, a.ld};
    } else {
      af = std::make_shared<Tensor>(std::vector<int64_t>{m, k});
      activation_to_f32(a, af->data());
      av = af->mat();
    }
    CocPending p = matmul_all_reduce_async(group, av, wd->mat(), WeightLayout::kKN, out, bias, opts);
    p.wait();  // the scratch weight dies with this call
    return CocPending();
  }

  Schedule s = choose_schedule(kOp, m, k, n, m, T, opts,
                               "compute-first: the int8-weight GEMM of chunk i+1 overlaps the all-reduce of chunk i");
  CocStats st = call_stats(s);
  ChunkPlan plan(m, 1, s.effective);
  log_schedule(group, s, &plan, opts);
  std::optional<TileSchedule> tiles;
  if (opts.deterministic) tiles.emplace(plan, /*compute_first=*/true);

  // The in-place all-reduce needs each chunk's rows back to back; a strided `out` gets a dense stand-in.
  const bool direct = is_contiguous(out);
  Scratch dst_buf;
  MatrixView dst = out;
  if (!direct) {
    dst_buf = make_scratch(m * n);
    dst = dense(dst_buf.get(), m, n);
  }
  auto gemm_rows = [&](int64_t begin, int64_t count) {
    produce(opts, {begin, count});
    matmul_w8(a.slice_rows(begin, count), w, dst.slice_rows(begin, count), false, gemm);
  };
  std::vector<Work> works;
  const int C = m == 0 ? 0 : plan.chunks();
  works.reserve(static_cast<size_t>(C));
  try {
    for (int c = 0; c < C; ++c) {
      const RowRange rr = plan.contiguous(c);
      Stopwatch sw;
      if (tiles) {
        for (int64_t t : tiles->tiles_for(c)) {
          const RowRange tr = tiles->rows(t);
          gemm_rows(tr.begin, tr.count);
        }
      } else {
        gemm_rows(rr.begin, rr.count);
      }
      st.gemm_s += sw.seconds();
      if (T == 1) continue;  // nothing to reduce
      const int64_t count = rr.count * n;
      const std::string tag = chunk_tag(kOp, opts, c, C, rr.count, n);
      if (opts.deterministic) {
        works.push_back(all_gather_then_sum(group, dst.row(rr.begin), out.slice_rows(rr.begin, rr.count), dst_buf,
                                            tag));
      } else {
        works.push_back(group.all_reduce(dst.row(rr.begin), count, ReduceOp::kSum, tag));
      }
      progress(group);
    }
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  st.chunks = C;
  commit_stats(opts, st);
  // T = 1 in deterministic mode computed straight into dst too; only the parts-sum path writes `out` directly.
  const bool copy_back = !direct && !(opts.deterministic && T > 1);
  auto finish = [dst_buf, dst, out, bias, copy_back]() {
    if (copy_back) copy_rows(dst, out);
    if (bias) add_bias(out, bias);
  };
  return CocPending(std::move(works), std::move(finish), opts.stats);
}

void w8a16_matmul_all_reduce(Communicator& group, ActivationView a, const Int8Weight& w, MatrixView out,
                             const float* bias, const CocOptions& opts, const W8GemmOptions& gemm) {
  w8a16_matmul_all_reduce_async(group, a, w, out, bias, opts, gemm).wait();
}

}  // namespace coc
