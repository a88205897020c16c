// `coc bench gemm` (bench_gemm.h). Per shape, the variants (each fp32 back end, then bf16 on oneDNN) are timed
// interleaved, one call of each per round (time_interleaved), so the VM's drift hits all of them alike and their
// ratio holds within one run. bf16 operands are converted once, outside the timing, as training keeps them.
#include "cli/bench_gemm.h"

#include <cstdio>
#include <functional>

#include "cli/bench_common.h"
#include "coc/comm/mesh.h"
#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"

namespace coc::cli::bench {

using nlohmann::json;

namespace {

struct Shape {
  int64_t m, k, n;
};

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, end - at);
    long long m = 0, k = 0, n = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld%c", &m, &k, &n, &tail) != 3 || m < 1 || k < 1 || n < 1)
      throw_invalid("--shapes: '{}' is not MxKxN with positive integers (e.g. 1024x4096x11008)", item);
    out.push_back({m, k, n});
    at = end + 1;
  }
  return out;
}

/// The operands of one shape in fp32 and bf16, U(-1, 1), the weight in `layout`.
struct Problem {
  Tensor x, w, y;
  std::vector<BFloat16> xh, wh;
  Problem(Shape s, WeightLayout layout)
      : x({s.m, s.k}), w(layout == WeightLayout::kNK ? std::vector<int64_t>{s.n, s.k} : std::vector<int64_t>{s.k, s.n}),
        y({s.m, s.n}), xh(static_cast<size_t>(x.numel())), wh(static_cast<size_t>(w.numel())) {
    uint64_t state = 12345;
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
    };
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = next();
    for (int64_t i = 0; i < w.numel(); ++i) w[i] = next();
    fp32_to_bf16(x.data(), xh.data(), x.numel());
    fp32_to_bf16(w.data(), wh.data(), w.numel());
  }
};

}  // namespace

int run_gemm(const GemmBenchOptions& o) {
  if (o.reps < 1 || o.warmup < 0) throw_invalid("--reps must be >= 1 and --warmup >= 0 (got {}, {})", o.reps, o.warmup);
  const auto shapes = parse_shapes(o.shapes);
  const auto backends = parse_list(o.backends, {"onednn", "openblas"}, "--backends");
  const auto dtypes = parse_list(o.dtypes, {"fp32", "bf16"}, "--dtype");
  const auto layouts = parse_list(o.layout, {"nk", "kn"}, "--layout");
  if (layouts.size() != 1) throw_invalid("--layout takes one of nk, kn (got '{}')", o.layout);
  const WeightLayout layout = layouts[0] == "nk" ? WeightLayout::kNK : WeightLayout::kKN;
  set_blas_threads(1);
  CommOptions co;
  Mesh g = make_mesh({}, co);  // tp = 1: the world only serves barriers and reductions
  Communicator& world = *g.world;
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  const GemmBackend saved = gemm_backend();
  const OneDnnInfo dnn = onednn_info();
  if (world.rank() == 0)
    std::printf("coc bench gemm: %d rank(s) each running the GEMM, weight layout %s, %d reps (+%d warmup), "
                "interleaved; oneDNN %s (%s), OpenBLAS %s\n%-22s %-14s %10s %10s %10s %9s\n",
                world.size(), to_string(layout), o.reps, o.warmup, dnn.version.c_str(), dnn.isa.c_str(),
                blas_config().c_str(), "m x k x n", "variant", "median ms", "min ms", "max ms", "GFLOP/s");
  json rows = json::array();
  for (const Shape& s : shapes) {
    Problem p(s, layout);
    std::vector<std::string> names;
    std::vector<std::function<void()>> bodies;
    for (const auto& d : dtypes) {
      if (d == "bf16") {
        names.push_back("bf16 onednn");
        bodies.push_back([&p, s, layout] {
          matmul(ConstBf16View{p.xh.data(), s.m, s.k, s.k},
                 ConstBf16View{p.wh.data(), p.w.rows(), p.w.cols(), p.w.cols()}, layout, p.y.mat());
        });
        continue;
      }
      for (const auto& b : backends) {
        names.push_back("fp32 " + b);
        bodies.push_back([&p, layout, be = parse_gemm_backend(b)] {
          set_gemm_backend(be);
          matmul(p.x.mat(), p.w.mat(), layout, p.y.mat());
        });
      }
    }
    const auto times = time_interleaved(world, o.warmup, o.reps, bodies);
    const double gflop = 2.0 * s.m * s.k * s.n * 1e-9;
    const std::string shape = fmt::format("{}x{}x{}", s.m, s.k, s.n);
    for (size_t v = 0; v < names.size(); ++v) {
      const Sample t = reduce_sample(world, times[v]);
      rows.push_back(
          {{"shape", shape}, {"variant", names[v]}, {"time_ms", t.to_json_ms()}, {"gflops", gflop / t.median}});
      if (world.rank() == 0)
        std::printf("%-22s %-14s %10.3f %10.3f %10.3f %9.1f\n", shape.c_str(), names[v].c_str(), t.median * 1e3,
                    t.min * 1e3, t.max * 1e3, gflop / t.median);
    }
    std::fflush(stdout);
  }
  set_gemm_backend(saved);
  json env = environment(world, 0);  // collective
  if (world.rank() == 0 && !o.json.empty())
    write_json(o.json, {{"command", "bench gemm"},
                        {"layout", to_string(layout)},
                        {"onednn", {{"version", dnn.version}, {"isa", dnn.isa}, {"f32_kernel", dnn.f32_kernel},
                                    {"bf16_kernel", dnn.bf16_kernel}, {"bf16_native", dnn.bf16_native}}},
                        {"environment", env},
                        {"rows", rows}});
  return 0;
}

}  // namespace coc::cli::bench
