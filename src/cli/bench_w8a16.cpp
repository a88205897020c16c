// `coc bench w8a16` (bench_w8a16.h): is dequantising one cache-sized k-panel at a time (matmul_w8's default) as
// fast as materialising the whole fp32 weight first, and how far from plain sgemm is either? Times per call:
// median over --reps, max over ranks; GFLOP/s = 2·m·n·k / time.
#include "cli/bench_w8a16.h"


#include <cstdio>
#include <random>

#include "cli/bench_common.h"
#include "coc/comm/mesh.h"
#include "coc/core/error.h"
#include "coc/core/fp16.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/quant.h"

namespace coc::cli::bench {

using nlohmann::json;

int run_w8a16(const W8a16BenchOptions& o) {
  if (o.m < 1 || o.k < 1 || o.n < 1) throw_invalid("--m, --k, --n must be >= 1 (got {}, {}, {})", o.m, o.k, o.n);
  if (o.reps < 1 || o.warmup < 0) throw_invalid("--reps must be >= 1 and --warmup >= 0");
  const QuantSpec spec = QuantSpec::parse(o.spec);
  const auto panels = parse_int_list(o.panels, "--panels");
  set_blas_threads(1);
  CommOptions co;
  Mesh g = make_mesh({}, co);  // tp = 1: the world only serves barriers and reductions
  Communicator& world = *g.world;
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  Tensor x({o.m, o.k}), w({o.k, o.n}), y({o.m, o.n});
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = d(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w[i] = d(rng);
  const Int8Weight q = quantize_weight(w.mat(), WeightLayout::kKN, spec, false);
  std::vector<uint16_t> xh(static_cast<size_t>(x.numel()));
  fp32_to_fp16(x.data(), xh.data(), x.numel());
  const double gflop = 2.0 * o.m * o.n * o.k * 1e-9;
  json rows = json::array();
  if (world.rank() == 0)
    std::printf("coc bench w8a16: m=%lld k=%lld n=%lld, %s, %d ranks each running the GEMM, F16C %s; weight bytes: "
                "fp32 %lld, int8+scales %lld (%.2fx smaller)\n%-34s %10s %10s %10s %9s\n",
                static_cast<long long>(o.m), static_cast<long long>(o.k), static_cast<long long>(o.n),
                spec.str().c_str(), world.size(), fp16_uses_f16c() ? "yes" : "no",
                static_cast<long long>(w.numel() * 4), static_cast<long long>(q.bytes()),
                static_cast<double>(w.numel() * 4) / static_cast<double>(q.bytes()), "variant", "median ms", "min ms",
                "max ms", "GFLOP/s");
  auto measure = [&](const std::string& name, auto&& body) {
    const Sample s = reduce_sample(world, time_reps(world, o.warmup, o.reps, body));
    rows.push_back({{"variant", name}, {"time_ms", s.to_json_ms()}, {"gflops", gflop / s.median}});
    if (world.rank() == 0)
      std::printf("%-34s %10.2f %10.2f %10.2f %9.1f\n", name.c_str(), s.median * 1e3, s.min * 1e3, s.max * 1e3,
                  gflop / s.median);
    std::fflush(stdout);
  };
  measure("fp32 sgemm (reference)", [&] { matmul(x.mat(), w.mat(), WeightLayout::kKN, y.mat()); });
  measure("w8 dequantise-all, fp32 x", [&] { matmul_w8(ActivationView::f32(x.mat()), q, y.mat(), false, {.dequantize_all = true}); });
  for (int p : panels)
    measure(fmt::format("w8 panel {} rows, fp32 x", p),
            [&] { matmul_w8(ActivationView::f32(x.mat()), q, y.mat(), false, {.panel_rows = p}); });
  measure("w8 panel auto (256 x <=1 MiB), fp32 x", [&] { matmul_w8(ActivationView::f32(x.mat()), q, y.mat()); });
  measure("w8 panel auto, fp16 x", [&] { matmul_w8(ActivationView::f16(xh.data(), o.m, o.k, o.k), q, y.mat()); });
  if (world.rank() == 0 && !o.json.empty())
    write_json(o.json, {{"command", "bench w8a16"},
                        {"m", o.m},
                        {"k", o.k},
                        {"n", o.n},
                        {"spec", spec.str()},
                        {"fp32_weight_bytes", w.numel() * 4},
                        {"w8_weight_bytes", q.bytes()},
                        {"environment", environment(world, 0)},
                        {"rows", rows}});
  else if (!o.json.empty())
    environment(world, 0);  // collective: every rank takes part in the gather
  return 0;
}

}  // namespace coc::cli::bench
