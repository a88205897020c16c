// `coc bench overlap` (bench_overlap.h): for each problem, op, engine and N, the op-level figures of
// docs/performance.md: T_gemm (the unsplit local GEMM), T_comm (the standalone collective on the same bytes), T_link
// (busiest-link bytes / --link-rate), T_serial (GEMM then collective, measured back to back), T_overlap (the CoC op),
// T_ideal = max(T_gemm, T_comm), S = T_serial / T_overlap, E_norm = (T_serial − T_overlap) / min(T_gemm, T_comm),
// exposed communication T_overlap − T_gemm, δ = Σ T_gemm(chunk) / T_gemm − 1, σ = (GEMM time inside the overlapped op,
// from CocStats) / Σ T_gemm(chunk) − 1, E_cap and the pipeline loss (the shortfall split into what δ and σ leave and
// what the schedule adds; docs/performance.md, the column table and point 15). Each figure: per rank the median of
// --reps repetitions (min/max as spread), then the max over ranks. Every row times its own GEMM, collective, serial
// pair and chunk GEMMs in the same rounds as its op, interleaved (bench_common.h, time_interleaved): on a VM whose
// speed drifts, a baseline timed once per op and compared with rows timed a minute later gave E_norm above 1 and δ of
// 0.7.
#include "cli/bench_overlap.h"


#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>

#include "cli/bench_common.h"
#include "cli/bench_plot.h"
#include "cli/bench_problems.h"
#include "coc/comm/process.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/partition.h"

namespace coc::cli::bench {

using nlohmann::json;

namespace {

/// H3's fused ops count their own fallbacks (CocStats::fused_fallbacks) once they exist; 0 before.
template <typename S>
int64_t fused_fallbacks(const S& s) {
  if constexpr (requires { s.fused_fallbacks; })
    return s.fused_fallbacks;
  else
    return 0;
}

void fill(Tensor& t, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = d(g);
}

/// The buffers of one (problem, op): the per-rank GEMM is [m, k] · [k, n] in every case.
struct Buffers {
  Tensor a;         ///< AR/RS: [m, k]; AG: this rank's rows [m/T, k]
  Tensor gathered;  ///< AG: [m, k] (the GEMM operand of T_gemm and the gather target of T_comm)
  Tensor w;         ///< [k, n], layout kKN
  Tensor out;       ///< AR: [m, n]; RS: [m/T, n]; AG: [m, n]
  Tensor full;      ///< [m, n]: the unsplit GEMM result, the AR/RS collective's send buffer
};

struct Figures {
  double t_gemm, t_comm, t_link, t_serial, t_ideal, S, S_star, E_norm, E_flux, exposed, delta, sigma, E_cap,
      pipeline_loss;
};

std::string ms(double s) { return fmt::format("{:.2f}", s * 1e3); }

}  // namespace

int run_overlap(const OverlapOptions& o) {
  if (o.reps < 1) throw_invalid("--reps must be >= 1 (7 or more for stable medians), got {}", o.reps);
  if (o.warmup < 0) throw_invalid("--warmup must be >= 0, got {}", o.warmup);
  if (!(o.link_rate >= 0)) throw_invalid("--link-rate must be >= 0 Gbit/s, got {}", o.link_rate);
  if (!(o.m_scale > 0)) throw_invalid("--m-scale must be > 0, got {}", o.m_scale);
  if (o.poll_us < 1) throw_invalid("--comm-poll-us must be >= 1, got {}", o.poll_us);
  const auto ops = parse_list(o.ops, bench_ops(), "--ops");
  // "auto" is CocOptions::kAuto (0): the automatic choice, tuned by one untimed call before its row is timed.
  std::vector<int> Ns;
  {
    std::string rest;
    std::stringstream ss(o.parallel_num);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item == "auto")
        Ns.push_back(CocOptions::kAuto);
      else
        rest += (rest.empty() ? "" : ",") + item;
    }
    if (!rest.empty() || Ns.empty())
      for (int n : parse_int_list(rest, "--coc-parallel-num")) Ns.push_back(n);
    std::stable_partition(Ns.begin(), Ns.end(), [](int n) { return n != CocOptions::kAuto; });  // auto last
  }
  const auto algos = parse_list(o.comm_algos, {"collective", "p2p"}, "--coc-comm-algo");
  const auto engines = parse_list(o.engines, {"inline", "thread"}, "--engine");
  const int T = world_size(), rank = world_rank();
  const ProblemFile file = load_problems(o.inputs, T, o.m_scale, o.problem);
  if (!o.problem.empty() && file.problems.empty()) throw_invalid("--problem '{}' is not in '{}'", o.problem, o.inputs);
  {
    // Every row is a (problem, op) pair of the file that --ops selects: none means a mistake, not an empty table.
    std::string offered;
    bool any = false;
    for (const auto& p : file.problems)
      for (const auto& op : p.ops) {
        any = any || std::find(ops.begin(), ops.end(), op) != ops.end();
        offered += fmt::format("{}{} {}", offered.empty() ? "" : ", ", p.name, op);
      }
    if (!any)
      throw_invalid("nothing to run: --ops {} selects none of the ops of '{}'{} ({}); pick from those", o.ops, o.inputs,
                    o.problem.empty() ? "" : " problem '" + o.problem + "'", offered);
  }
  int name_w = 12;  // the problem column fits the longest name
  for (const auto& p : file.problems) name_w = std::max(name_w, static_cast<int>(p.name.size()));
  set_blas_threads(1);

  // One process group set per engine (every rank builds them in the same order: collective).
  std::vector<Mesh> groups = groups_per_engine(engines, T, o.poll_us, o.nonblocking_impl);
  Communicator& world = *groups[0].world;
  {
    const std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", o.inputs, o.ops, o.parallel_num, o.engines, o.reps, o.warmup,
                    o.m_scale, o.fused, o.problem, o.comm_algos, o.nonblocking_impl);
    world.check_same(fnv1a(key.data(), key.size()), "the coc bench overlap arguments");
  }
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  if (!o.plot.empty()) check_writable(world, o.plot, "--plot");
  json env = environment(world, o.link_rate);

  int total = 0;
  for (const auto& p : file.problems)
    if (o.problem.empty() || p.name == o.problem)
      for (const auto& op : p.ops)
        if (std::find(ops.begin(), ops.end(), op) != ops.end())
          total += static_cast<int>(engines.size() * Ns.size() * algos.size() * (o.fused ? 2 : 1));
  Progress progress(rank, total);

  if (rank == 0) {
    std::printf("coc bench overlap: %s (%s), shapes per rank for tp=%d, run on tp=%d; %d reps (+%d warmup), "
                "times in ms: median over reps, max over ranks\n",
                file.model.c_str(), o.inputs.c_str(), file.tp, T, o.reps, o.warmup);
    std::printf("%-*s %-14s %-6s %4s %-10s %-5s %6s %5s %5s | %8s %8s %8s %8s %8s %17s %8s | %5s %6s %8s %6s %6s %5s "
                "%6s %3s\n",
                name_w, "problem", "op", "engine", "N", "algo", "fused", "m", "k", "n", "T_gemm", "T_comm", "T_link",
                "T_serial", "T_overl", "(min..max)", "T_ideal", "S", "E_norm", "exposed", "delta", "sigma", "E_cap",
                "pipe", "fb");
    std::fflush(stdout);
  }

  json rows = json::array();
  for (const auto& p : file.problems) {
    if (!o.problem.empty() && p.name != o.problem) continue;
    for (const auto& op : p.ops) {
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) continue;
      const bool ag = op == "all_gather", rs = op == "reduce_scatter";
      {
        // The row's buffers (weight, full product, input, gathered input, output), fp32: refuse a shape that cannot
        // fit rather than die in the allocator.
        const double m = static_cast<double>(p.m), k = static_cast<double>(p.k), n = static_cast<double>(p.n);
        const double need = 4.0 * (k * n + 2.0 * m * n + 2.0 * m * k);
        const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
        if (have > 0 && need > have)
          throw_invalid("problem '{}' ({}: m={} k={} n={}) needs {:.1f} GiB of buffers per rank, more than this "
                        "machine's {:.1f} GiB; lower its m, k or n, or --m-scale",
                        p.name, op, p.m, p.k, p.n, need / (1 << 30), have / (1 << 30));
      }
      const RowRange share = split_rows(p.m, T, groups[0].tp->rank());
      Buffers b;
      b.w = Tensor({p.k, p.n});
      fill(b.w, 2);
      b.full = Tensor({p.m, p.n});
      if (ag) {
        b.a = Tensor({share.count, p.k});
        b.gathered = Tensor({p.m, p.k});
        b.out = Tensor({p.m, p.n});
        fill(b.gathered, 1);
      } else {
        b.a = Tensor({p.m, p.k});
        b.out = Tensor({rs ? share.count : p.m, p.n});
      }
      fill(b.a, 1 + static_cast<uint64_t>(rank));
      const ConstMatrixView gemm_in = ag ? b.gathered.mat() : b.a.mat();

      auto gemm_alone = [&] { matmul(gemm_in, b.w.mat(), WeightLayout::kKN, b.full.mat()); };
      // Bytes of the collective (whole message, as nccl-tests' "size"): AR/RS reduce [m, n], AG gathers [m, k].
      const double bytes = 4.0 * static_cast<double>(p.m) * static_cast<double>(ag ? p.k : p.n);
      const double link_factor = op == "all_reduce" ? 2.0 * (T - 1) / T : static_cast<double>(T - 1) / T;
      const double t_link = o.link_rate > 0 ? bytes * link_factor / (o.link_rate * 1e9 / 8) : 0.0;
      std::vector<int64_t> counts(static_cast<size_t>(T)), displs(static_cast<size_t>(T));
      for (int r = 0; r < T; ++r) {
        const RowRange s = split_rows(p.m, T, r);
        counts[static_cast<size_t>(r)] = s.count * (ag ? p.k : p.n);
        displs[static_cast<size_t>(r)] = s.begin * (ag ? p.k : p.n);
      }

      for (size_t ei = 0; ei < engines.size(); ++ei) {
        Communicator& tp = *groups[ei].tp;
        // The serial baseline uses the best MPI collective: the non-blocking call coc's ops post (through the
        // engine) or the blocking one, whichever is faster here. Open MPI's large MPI_Iallreduce (and, with
        // --comm-nonblocking-impl mpi, its MPI_Ireduce_scatter) is several times slower than the blocking call
        // (docs/performance.md), and a baseline built on it would flatter every overlapped path.
        auto nonblocking = [&] {
          Work wk;
          if (op == "all_reduce")
            wk = tp.all_reduce(b.full.data(), p.m * p.n, ReduceOp::kSum, "bench T_comm");
          else if (rs)
            wk = tp.reduce_scatter(b.full.data(), b.out.data(), counts, "bench T_comm");
          else
            wk = tp.all_gather(b.a.data(), b.gathered.data(), counts, displs, "bench T_comm");
          wk.wait();
        };
        auto blocking = [&] {
          if (op == "all_reduce")
            tp.all_reduce(b.full.data(), p.m * p.n, ReduceOp::kSum, "bench T_comm", /*blocking=*/true);
          else if (rs)
            tp.reduce_scatter(b.full.data(), b.out.data(), counts, "bench T_comm", /*blocking=*/true);
          else  // in place (MPI_IN_PLACE): this rank's share is read from its place in the gathered buffer
            tp.all_gather(b.gathered.data() + displs[static_cast<size_t>(tp.rank())], b.gathered.data(), counts,
                          displs, "bench T_comm", /*blocking=*/true);
        };
        // Which collective the baseline uses is decided once per op; each row then times its own baselines.
        const Sample t_comm_nb = reduce_sample(tp, time_reps(tp, o.warmup, o.reps, nonblocking));
        const Sample t_comm_b = reduce_sample(tp, time_reps(tp, o.warmup, o.reps, blocking));
        const bool use_blocking = t_comm_b.median < t_comm_nb.median;
        auto collective = [&] { use_blocking ? blocking() : nonblocking(); };
        if (ag)  // MPI_IN_PLACE all-gather reads this rank's share from its place in the gathered buffer
          std::copy(b.a.data(), b.a.data() + counts[static_cast<size_t>(tp.rank())],
                    b.gathered.data() + displs[static_cast<size_t>(tp.rank())]);
        auto serial = [&] {
          if (ag) {
            collective();
            matmul(b.gathered.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat());
          } else {
            matmul(b.a.mat(), b.w.mat(), WeightLayout::kKN, b.full.mat());
            collective();
          }
        };
        for (int N : Ns) {
          for (size_t ai = 0; ai < algos.size(); ++ai)
          for (int fused = 0; fused <= (o.fused ? 1 : 0); ++fused) {
            const bool auto_n = N == CocOptions::kAuto;
            const std::string label = auto_n ? "auto" : std::to_string(N);
            progress.step(fmt::format("{} {} {} N={} {}{}", p.name, op, engines[ei], label, algos[ai],
                                      fused ? " fused" : ""));
            // One row per distinct schedule: the fused kernel ignores the algorithm and the automatic choice picks
            // its own, so those rows run once (with the first --coc-comm-algo); p2p exists with N > 1 only.
            const bool p2p = algos[ai] == "p2p";
            if ((fused || auto_n) && ai > 0) continue;
            if (p2p && N == 1 && !fused) continue;
            CocOptions co;
            co.parallel_num = N;
            co.comm_algo = p2p ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
            co.fused = fused != 0;
            co.tag = "bench " + p.name;
            auto run_op = [&] {
              if (op == "all_reduce")
                matmul_all_reduce(tp, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
              else if (rs)
                matmul_reduce_scatter(tp, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
              else
                all_gather_matmul(tp, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
            };
            std::string algo_label = fused ? "fused" : algos[ai];
            std::optional<CocAutoChoice> choice;  // what the auto row chose
            if (auto_n) {
              coc_auto_forget();  // time the candidates now, untimed, for this engine's communicator
              run_op();
              if (const auto all = coc_auto_choices(); !all.empty()) choice = all.back();
              if (choice && choice->fused)
                algo_label = "fused";  // on one node the fused kernel runs and N is a placeholder
              else if (choice)  // off-node the fused kernel falls back to the timed choice
                algo_label = choice->parallel_num == 1
                                 ? std::string("->serial")
                                 : fmt::format("->{}{}", choice->parallel_num,
                                               choice->algo == CocCommAlgo::kP2p ? "p2p" : "coll");
            }
            const int n_run = auto_n ? (choice && !choice->fused ? choice->parallel_num : 1) : N;
            const ChunkPlan plan(p.m, ag || rs ? T : 1, n_run);
            // Σ T_gemm(chunk): the op's chunk GEMMs alone, with the op's row plan (contiguous chunks of all m rows
            // for the all-reduce, one GEMM per rank sub-block for reduce-scatter and all-gather).
            auto chunk_gemms = [&] {
              for (int c = 0; c < plan.chunks(); ++c) {
                if (ag || rs) {
                  for (int r = 0; r < T; ++r) {
                    const RowRange s = plan.sub(r, c);
                    if (s.count > 0)
                      matmul(gemm_in.slice_rows(s.begin, s.count), b.w.mat(), WeightLayout::kKN,
                             b.full.mat().slice_rows(s.begin, s.count));
                  }
                } else {
                  const RowRange s = plan.contiguous(c);
                  matmul(gemm_in.slice_rows(s.begin, s.count), b.w.mat(), WeightLayout::kKN,
                         b.full.mat().slice_rows(s.begin, s.count));
                }
              }
            };
            std::vector<double> gemm_inside;
            int64_t fallbacks = 0;
            int calls = 0;
            auto overlapped = [&] {
              CocStats st;
              co.stats = &st;
              run_op();
              if (++calls > o.warmup) {
                gemm_inside.push_back(st.gemm_s);
                fallbacks = st.serial_fallbacks + fused_fallbacks(st);  // per call: the schedule is deterministic
              }
            };
            // Every figure of the row from the same rounds: GEMM alone, collective alone, the serial pair, the
            // chunk GEMMs and the overlapped op, interleaved (time_interleaved), so that E_norm and σ compare
            // times taken seconds apart, not minutes.
            const auto times = time_interleaved(tp, o.warmup, o.reps, {gemm_alone, collective, serial, chunk_gemms,
                                                                       overlapped});
            const Sample t_gemm = reduce_sample(tp, times[0]);
            const Sample t_comm = reduce_sample(tp, times[1]);
            const Sample t_serial = reduce_sample(tp, times[2]);
            const Sample t_chunks = reduce_sample(tp, times[3]);
            const Sample t_overlap = reduce_sample(tp, times[4]);
            const Sample t_gemm_inside = reduce_sample(tp, gemm_inside);
            const double fb = tp.all_reduce_value(static_cast<double>(fallbacks), ReduceOp::kMax, "bench fallbacks");
            Figures f{};
            f.t_gemm = t_gemm.median;
            f.t_comm = t_comm.median;
            f.t_link = t_link;
            f.t_serial = t_serial.median;
            f.t_ideal = std::max(f.t_gemm, f.t_comm);
            f.S = f.t_serial / t_overlap.median;
            f.S_star = f.t_serial / f.t_ideal;
            const double hideable = std::min(f.t_gemm, f.t_comm);
            f.E_norm = hideable > 0 ? (f.t_serial - t_overlap.median) / hideable : 0.0;
            f.E_flux = f.t_comm > 0 ? (f.t_serial - t_overlap.median) / f.t_comm : 0.0;
            f.exposed = t_overlap.median - f.t_gemm;
            f.delta = t_chunks.median / f.t_gemm - 1.0;
            f.sigma = t_gemm_inside.median / t_chunks.median - 1.0;
            // The op cannot beat its own GEMM as slowed by chunking and by the communication on its core, nor the
            // transfer: what it takes beyond that is the schedule's.
            const double t_floor = std::max(t_gemm_inside.median, f.t_comm);
            f.E_cap = hideable > 0 ? (f.t_serial - t_floor) / hideable : 0.0;
            f.pipeline_loss = t_overlap.median - t_floor;
            json row = {{"problem", p.name},
                        {"layer", p.layer},
                        {"op", op},
                        {"engine", engines[ei]},
                        {"N", auto_n ? json("auto") : json(N)},
                        {"algo", algo_label},
                        {"auto_choice", choice ? json{{"parallel_num", choice->parallel_num},
                                                      {"algo", to_string(choice->algo)},
                                                      {"fused", choice->fused},
                                                      {"reason", choice->reason},
                                                      {"candidates_ms", choice->candidates_ms}}
                                               : json(nullptr)},
                        {"effective_chunks", plan.chunks()},
                        {"fused", fused != 0},
                        {"m", p.m},
                        {"k", p.k},
                        {"n", p.n},
                        {"bytes", bytes},
                        {"t_gemm_ms", t_gemm.to_json_ms()},
                        {"t_comm_ms", t_comm.to_json_ms()},
                        {"t_comm_collective", use_blocking ? "blocking" : "non-blocking"},
                        {"t_comm_nonblocking_ms", t_comm_nb.to_json_ms()},
                        {"t_comm_blocking_ms", t_comm_b.to_json_ms()},
                        {"t_link_ms", o.link_rate > 0 ? json(t_link * 1e3) : json(nullptr)},
                        {"t_serial_ms", t_serial.to_json_ms()},
                        {"t_overlap_ms", t_overlap.to_json_ms()},
                        {"t_ideal_ms", f.t_ideal * 1e3},
                        {"t_chunk_gemms_ms", t_chunks.to_json_ms()},
                        {"t_gemm_inside_overlap_ms", t_gemm_inside.to_json_ms()},
                        {"S", f.S},
                        {"S_star", f.S_star},
                        {"E_norm", f.E_norm},
                        {"E_flux", f.E_flux},
                        {"exposed_comm_ms", f.exposed * 1e3},
                        {"delta", f.delta},
                        {"sigma", f.sigma},
                        {"E_norm_cap", f.E_cap},
                        {"pipeline_loss_ms", f.pipeline_loss * 1e3},
                        {"fallbacks", static_cast<int64_t>(fb)}};
            rows.push_back(row);
            if (rank == 0) {
              std::printf("%-*s %-14s %-6s %4s %-10s %-5s %6lld %5lld %5lld | %8s %8s %8s %8s %8s %17s %8s | %5.2f "
                          "%6.2f %8s %6.3f %6.3f %5.2f %6s %3lld\n",
                          name_w, p.name.c_str(), op.c_str(), engines[ei].c_str(), label.c_str(), algo_label.c_str(),
                          fused ? "yes" : "no",
                          static_cast<long long>(p.m), static_cast<long long>(p.k), static_cast<long long>(p.n),
                          ms(f.t_gemm).c_str(), ms(f.t_comm).c_str(), o.link_rate > 0 ? ms(t_link).c_str() : "-",
                          ms(f.t_serial).c_str(), ms(t_overlap.median).c_str(),
                          fmt::format("({}..{})", ms(t_overlap.min), ms(t_overlap.max)).c_str(),
                          ms(f.t_ideal).c_str(), f.S, f.E_norm, ms(f.exposed).c_str(), f.delta, f.sigma, f.E_cap,
                          fmt::format("{:.1f}", f.pipeline_loss * 1e3).c_str(), static_cast<long long>(fb));
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }
  if (rank == 0) {
    json record = {{"command", "bench overlap"},
                   {"inputs", o.inputs},
                   {"model", file.model},
                   {"tp_of_shapes", file.tp},
                   {"tp", T},
                   {"reps", o.reps},
                   {"warmup", o.warmup},
                   {"coc_parallel_num", o.parallel_num},
                   {"coc_comm_algo", algos},
                   {"engines", engines},
                   {"comm_poll_us", o.poll_us},
                   {"comm_nonblocking_impl", o.nonblocking_impl},
                   {"m_scale", o.m_scale},
                   {"statistic",
                    "per rank: median (min, max) over reps; then max over ranks; each row's T_gemm, T_comm, T_serial "
                    "and chunk GEMMs timed in the same rounds as its op, interleaved"},
                   {"environment", env},
                   {"rows", rows}};
    if (!o.json.empty()) write_json(o.json, record);
    if (!o.plot.empty()) write_overlap_svg(o.plot, record);
  }
  return 0;
}

}  // namespace coc::cli::bench
