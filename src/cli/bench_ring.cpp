// `coc bench ring-attention` (bench_ring.h). The variants run interleaved (time_interleaved), so that the machine's
// drift does not enter the differences.
#include "cli/bench_ring.h"

#include <algorithm>
#include <cstdio>

#include "cli/bench_common.h"
#include "coc/comm/mesh.h"
#include "coc/comm/progress_engine.h"
#include "coc/comm/process.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/parallel/ring_attention.h"
#include "coc/runtime/memory.h"

namespace coc::cli::bench {

using nlohmann::json;

int run_ring_bench(const RingBenchOptions& o) {
  if (o.reps < 1 || o.warmup < 0) throw_invalid("--reps must be >= 1 and --warmup >= 0");
  if (o.heads < 1 || o.head_dim < 1 || o.batch < 1)
    throw_invalid("--num-attention-heads {}, --kv-channels {}, --micro-batch-size {} must be >= 1", o.heads,
                  o.head_dim, o.batch);
  set_blas_threads(1);
  const int world = world_size();
  const int cp = o.cp == 0 ? world : o.cp;
  if (cp < 1 || world % cp != 0)
    throw_invalid("--context-parallel-size {} must divide the world size {}", cp, world);
  check_ring_attention_sizes(o.seq, cp, o.window_size);
  CommOptions copts;
  copts.engine = parse_engine_kind(o.engine);
  copts.poll_us = o.poll_us;
  Mesh g = make_mesh({.tp = 1, .cp = cp}, copts);
  if (!o.json.empty()) check_writable(*g.world, o.json, "--json");
  // The attention's memory: the peak growth from here, where nothing of it is allocated yet.
  const ResidentMemory before = resident_memory();
  std::unique_ptr<Communicator> dup;
  const CpRing plain = make_cp_ring(*g.cp, false, dup), duplex = make_cp_ring(*g.cp, true, dup);
  const int64_t L = o.seq / cp * o.batch, C = o.heads * o.head_dim;
  Tensor q({L, C}), k({L, C}), v({L, C}), dout({L, C}), out({L, C}), dq({L, C}), dk({L, C}), dv({L, C});
  for (Tensor* t : {&q, &k, &v, &dout})
    for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  std::vector<float> lse(static_cast<size_t>(L * o.heads));
  RingAttentionOptions ro;
  ro.mask = o.mask == "causal" ? AttnMask::kCausal : AttnMask::kFull;
  ro.window_size = o.window_size;
  ro.tag = "bench ring_attention";
  auto attention = [&](const CpRing& ring, bool serial) {
    RingAttentionOptions r = ro;
    r.serial = serial;
    return [&, r, ring] {
      ring_attention_forward(ring, q.mat(), k.mat(), v.mat(), o.batch, o.heads, o.head_dim, r, out.mat(), lse.data());
      ring_attention_backward(ring, q.mat(), k.mat(), v.mat(), out.mat(), lse.data(), dout.mat(), o.batch, o.heads,
                              o.head_dim, r, dq.mat(), dk.mat(), dv.mat());
    };
  };
  // The transfers alone: what forward and backward move around the plain ring (2·(CP−1) K+V hops, CP dK+dV hops),
  // each a block of K and V (or dK and dV): 2·L·C floats.
  std::vector<float> send(static_cast<size_t>(2 * L * C)), recv(send.size());
  auto transfers = [&] {
    const int P = g.cp->size(), r = g.cp->rank();
    if (P == 1) return;
    const P2pSend s{(r + 1) % P, send.data(), static_cast<int64_t>(send.size())};
    const P2pRecv x{(r + P - 1) % P, recv.data(), static_cast<int64_t>(recv.size())};
    for (int i = 0; i < 3 * P - 2; ++i) g.cp->exchange({&s, 1}, {&x, 1}, "bench ring transfers").wait();
  };
  const std::vector<std::string> names = {"serial (wait each transfer)", "overlapped, one communicator",
                                          "overlapped, send/recv on two", "transfers alone"};
  const auto times = time_interleaved(*g.world, o.warmup, o.reps,
                                      {attention(plain, true), attention(plain, false), attention(duplex, false),
                                       transfers});
  std::vector<Sample> s;
  for (const auto& t : times) s.push_back(reduce_sample(*g.world, t));
  float mib[1] = {static_cast<float>(std::max<int64_t>(0, resident_memory().peak_bytes - before.current_bytes)) /
                  (1 << 20)};
  g.world->all_reduce(mib, 1, ReduceOp::kMax, "bench ring memory").wait();
  const double t_comm = s[3].median;
  auto hidden = [&](const Sample& x) { return t_comm > 0 ? (s[0].median - x.median) / t_comm : 0.0; };
  json rows = json::array();
  if (g.world->rank() == 0)
    std::printf("coc bench ring-attention: cp=%d, window %d, seq %lld, batch %lld, heads %lld, head dim %lld, %s "
                "mask, %s engine; forward + backward\n%-32s %10s %10s %10s %8s\n",
                cp, o.window_size, static_cast<long long>(o.seq), static_cast<long long>(o.batch),
                static_cast<long long>(o.heads), static_cast<long long>(o.head_dim), o.mask.c_str(), o.engine.c_str(), "variant",
                "median ms", "min ms", "max ms", "hidden");
  for (size_t i = 0; i < names.size(); ++i) {
    json row = {{"variant", names[i]}, {"time_ms", s[i].to_json_ms()}};
    if (i == 1 || i == 2) row["hidden"] = hidden(s[i]);
    rows.push_back(row);
    if (g.world->rank() == 0) {
      std::printf("%-32s %10.2f %10.2f %10.2f", names[i].c_str(), s[i].median * 1e3, s[i].min * 1e3, s[i].max * 1e3);
      if (i == 1 || i == 2) std::printf(" %7.0f%%", 100 * hidden(s[i]));
      std::printf("\n");
    }
  }
  if (g.world->rank() == 0)
    std::printf("hidden = (T_serial - T_overlapped) / T_transfers: the share of the ring's transfer time that the "
                "block attention covers\nattention memory per rank: %.1f MiB (peak resident growth, max over ranks; "
                "a whole-sequence score matrix would be %.1f MiB)\n",
                mib[0], static_cast<double>(o.seq) * o.seq * o.batch * o.heads * 4 / (1 << 20));
  json env = environment(*g.world, 0);  // collective: every rank takes part in the gather
  if (g.world->rank() == 0 && !o.json.empty())
    write_json(o.json, {{"command", "bench ring-attention"},
                        {"cp", cp},
                        {"window_size", o.window_size},
                        {"seq", o.seq},
                        {"batch", o.batch},
                        {"heads", o.heads},
                        {"head_dim", o.head_dim},
                        {"mask", o.mask},
                        {"engine", o.engine},
                        {"attention_memory_mib", mib[0]},
                        {"environment", env},
                        {"rows", rows}});
  return 0;
}

}  // namespace coc::cli::bench
