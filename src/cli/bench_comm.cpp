// `coc bench comm` (bench_comm.h), following nccl-tests (github.com/NVIDIA/nccl-tests, its doc/PERFORMANCE notes):
// "size" is the whole buffer in bytes (the all-reduce buffer; the reduce-scatter input / all-gather output of all
// ranks), count = size / 4 fp32 elements, rounded down to a multiple of the rank count for reduce-scatter and
// all-gather as nccl-tests does; algbw = size / time, busbw = algbw · factor with factor 2(n−1)/n for all-reduce
// and (n−1)/n for reduce-scatter and all-gather, so that busbw is comparable with the link's bandwidth whatever n
// is. Time: per rank the median of --reps (min/max spread), then the max over ranks. --dtype bf16/fp16 (coc's
// own): the same count of 16-bit elements, so a row's size is half the fp32 row's and rows of one count compare
// the same tensor sent in 4 or 2 bytes; algbw and busbw are in bytes as nccl-tests counts them.
#include "cli/bench_comm.h"

#include <cstdio>

#include "cli/bench_common.h"
#include "coc/comm/process.h"
#include "coc/core/dtype.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/fused_ops.h"

namespace coc::cli::bench {

using nlohmann::json;

int run_comm(const CommBenchOptions& o) {
  if (o.reps < 1) throw_invalid("--reps must be >= 1, got {}", o.reps);
  if (o.warmup < 0) throw_invalid("--warmup must be >= 0, got {}", o.warmup);
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes)
    throw_invalid("--min-bytes ({}) must be >= 4 and <= --max-bytes ({})", o.min_bytes, o.max_bytes);
  if (o.factor < 2) throw_invalid("--factor must be >= 2 (sizes grow by it), got {}", o.factor);
  if (o.max_bytes > (int64_t{1} << 33))
    throw_invalid("--max-bytes {} is above 8 GiB; MPI counts are int (use a smaller size)", o.max_bytes);
  if (o.poll_us < 1) throw_invalid("--comm-poll-us must be >= 1, got {}", o.poll_us);
  const auto ops = parse_list(o.ops, {"all_reduce", "reduce_scatter", "all_gather", "shm_all_reduce"}, "--ops");
  const auto engines = parse_list(o.engines, {"inline", "thread"}, "--engine");
  const auto dtype_names = parse_list(o.dtypes, {"fp32", "bf16", "fp16"}, "--dtype");
  const int T = world_size(), rank = world_rank();
  set_blas_threads(1);
  std::vector<Mesh> groups = groups_per_engine(engines, T, o.poll_us, o.nonblocking_impl);
  Communicator& world = *groups[0].world;
  {
    const std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}", o.ops, o.engines, o.min_bytes, o.max_bytes,
                                        o.factor, o.reps, o.warmup, o.nonblocking_impl, o.dtypes);
    world.check_same(fnv1a(key.data(), key.size()), "the coc bench comm arguments");
  }
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  json env = environment(world, 0);
  std::vector<int64_t> sizes;
  for (int64_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) sizes.push_back(s);
  Progress progress(rank, static_cast<int>(sizes.size() * ops.size() * engines.size() * dtype_names.size()));
  const size_t max_count = static_cast<size_t>(o.max_bytes / 4) + 1;
  std::vector<float> buf(max_count, 1.0f), out(max_count, 0.0f);
  std::vector<BFloat16> buf_bf16(max_count, float_to_bf16(1.0f)), out_bf16(max_count);
  std::vector<Float16> buf_fp16(max_count, Float16{0x3c00}), out_fp16(max_count);  // 0x3c00 = 1.0
  if (rank == 0)
    std::printf("coc bench comm: %d ranks, %s, %d reps (+%d warmup); time: median over reps, max over ranks\n"
                "%14s %12s %-14s %-5s %-6s %10s %10s %10s %9s %9s\n",
                T, o.dtypes.c_str(), o.reps, o.warmup, "size (B)", "count", "op", "dtype", "engine", "time (us)",
                "min (us)", "max (us)", "algbw", "busbw");
  json rows = json::array();
  // One collective of `count` elements of type `t` (counts/displs per rank for the uneven-capable ops).
  auto issue = [&](Communicator& tp, const std::string& op, DType t, int64_t count, std::span<const int64_t> counts,
                   std::span<const int64_t> displs) -> Work {
    auto run = [&](auto* in, auto* res) {
      if (op == "all_reduce") return tp.all_reduce(in, count, ReduceOp::kSum, "bench comm");
      if (op == "reduce_scatter") return tp.reduce_scatter(in, res, counts, "bench comm");
      return tp.all_gather(in, res, counts, displs, "bench comm");
    };
    if (t == DType::kBF16) return run(buf_bf16.data(), out_bf16.data());
    if (t == DType::kF16) return run(buf_fp16.data(), out_fp16.data());
    return run(buf.data(), out.data());
  };
  // Why a row of the node-shared all-reduce (fused_ops.h) is skipped, or "": it needs no progress engine, so it runs
  // once, under the first engine's group; it is fp32 only; and it is unavailable with one rank or several nodes (the
  // fused ops then fall back).
  auto shm_skip = [&](Communicator& tp, DType dtype) -> std::string {
    if (dtype != DType::kF32) return "fp32 only";
    return fused_unavailable_reason(tp);
  };
  for (const auto& op : ops)
    for (const auto& dtype_name : dtype_names)
      for (size_t ei = 0; ei < engines.size(); ++ei) {
        const DType dtype = parse_dtype(dtype_name, "--dtype");
        Communicator& tp = *groups[ei].tp;
        const bool shm = op == "shm_all_reduce";
        if (shm && ei > 0) continue;
        if (const std::string why = shm ? shm_skip(tp, dtype) : std::string(); !why.empty()) {
          if (rank == 0) std::printf("%-14s %-5s skipped: %s\n", op.c_str(), dtype_name.c_str(), why.c_str());
          rows.push_back({{"op", op}, {"dtype", dtype_name}, {"skipped", why}});
          continue;
        }
        const std::string engine = shm ? "shm" : engines[ei];
        for (int64_t size : sizes) {
          progress.step(fmt::format("{} {} {} {} B", op, dtype_name, engine, size));
          int64_t count = size / 4;
          if (op == "reduce_scatter" || op == "all_gather") count = std::max<int64_t>(T, count / T * T);
          const int64_t bytes = count * dtype_size(dtype);
          std::vector<int64_t> counts(static_cast<size_t>(T)), displs(static_cast<size_t>(T));
          for (int r = 0; r < T; ++r) {
            counts[static_cast<size_t>(r)] = count / T;
            displs[static_cast<size_t>(r)] = r * (count / T);
          }
          const auto times = time_reps(tp, o.warmup, o.reps, [&] {
            Work w;
            if (shm)
              shm_all_reduce(tp, buf.data(), count, "bench comm");
            else
              w = issue(tp, op, dtype, count, counts, displs);
            w.wait();
          });
          const Sample t = reduce_sample(tp, times);
          const double factor = op == "all_reduce" || shm ? 2.0 * (T - 1) / T : static_cast<double>(T - 1) / T;
          const double algbw = static_cast<double>(bytes) / t.median / 1e9;  // GB/s
          const double busbw = algbw * factor;
          rows.push_back({{"op", op},
                          {"engine", engine},
                          {"size_bytes", bytes},
                          {"count", count},
                          {"type", dtype == DType::kF32 ? "float" : dtype_name},
                          {"dtype", dtype_name},
                          {"time_us", {{"median", t.median * 1e6}, {"min", t.min * 1e6}, {"max", t.max * 1e6}}},
                          {"algbw_gbps", algbw},
                          {"busbw_gbps", busbw},
                          {"busbw_factor", factor}});
          if (rank == 0) {
            std::printf("%14lld %12lld %-14s %-5s %-6s %10.1f %10.1f %10.1f %9.3f %9.3f\n",
                        static_cast<long long>(bytes), static_cast<long long>(count), op.c_str(), dtype_name.c_str(),
                        engine.c_str(), t.median * 1e6, t.min * 1e6, t.max * 1e6, algbw, busbw);
            std::fflush(stdout);
          }
        }
      }
  if (rank == 0 && !o.json.empty())
    write_json(o.json, {{"command", "bench comm"},
                        {"tp", T},
                        {"reps", o.reps},
                        {"warmup", o.warmup},
                        {"units", {{"time", "us"}, {"algbw", "GB/s (1e9 B/s)"}, {"busbw", "GB/s"}}},
                        {"statistic", "per rank: median (min, max) over reps; then max over ranks"},
                        {"environment", env},
                        {"rows", rows}});
  return 0;
}

}  // namespace coc::cli::bench
