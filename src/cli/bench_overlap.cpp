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
#include "coc/core/bf16.h"
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
  /// --dtype bf16: the baseline collectives' bf16 twins of full, out, a and gathered (empty under fp32).
  std::vector<BFloat16> full16, out16, a16, gathered16;
  bool wire16() const { return !full16.empty(); }
};

struct Figures {
  double t_gemm, t_comm, t_link, t_serial, t_ideal, S, S_star, E_norm, E_flux, exposed, delta, sigma, E_cap,
      pipeline_loss;
};

std::string ms(double s) { return fmt::format("{:.2f}", s * 1e3); }

/// --coc-parallel-num: the numbers, and "auto" (CocOptions::kAuto: the automatic choice, tuned by one untimed call
/// before its row is timed) last.
std::vector<int> parse_parallel_nums(const std::string& text) {
  std::vector<int> Ns;
  std::string rest;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item == "auto")
      Ns.push_back(CocOptions::kAuto);
    else
      rest += (rest.empty() ? "" : ",") + item;
  }
  if (!rest.empty() || Ns.empty())
    for (int n : parse_int_list(rest, "--coc-parallel-num")) Ns.push_back(n);
  std::stable_partition(Ns.begin(), Ns.end(), [](int n) { return n != CocOptions::kAuto; });  // auto last
  return Ns;
}

/// What one run measures: the lists its flags select, the problems, and the problem column's width.
struct Plan {
  std::vector<std::string> ops, algos, engines;
  std::vector<int> Ns;
  int T = 1, rank = 0;
  ProblemFile file;
  int name_w = 12;  ///< the problem column fits the longest name

  /// Whether (problem `p`, `op`) has rows in this run: --problem and --ops select it.
  bool selects(const OverlapOptions& o, const Problem& p, const std::string& op) const {
    return (o.problem.empty() || p.name == o.problem) && std::find(ops.begin(), ops.end(), op) != ops.end();
  }
};

/// Every row is a (problem, op) pair of the file that --ops selects: none means a mistake, not an empty table.
void check_ops_offered(const OverlapOptions& o, const Plan& plan) {
  std::string offered;
  bool any = false;
  for (const auto& p : plan.file.problems)
    for (const auto& op : p.ops) {
      any = any || std::find(plan.ops.begin(), plan.ops.end(), op) != plan.ops.end();
      offered += fmt::format("{}{} {}", offered.empty() ? "" : ", ", p.name, op);
    }
  if (!any)
    throw_invalid("nothing to run: --ops {} selects none of the ops of '{}'{} ({}); pick from those", o.ops, o.inputs,
                  o.problem.empty() ? "" : " problem '" + o.problem + "'", offered);
}

/// Validates the options and loads the problem file. Throws kInvalidArgument (one line) for a bad option.
Plan make_plan(const OverlapOptions& o) {
  if (o.reps < 1) throw_invalid("--reps must be >= 1 (7 or more for stable medians), got {}", o.reps);
  if (o.warmup < 0) throw_invalid("--warmup must be >= 0, got {}", o.warmup);
  if (!(o.link_rate >= 0)) throw_invalid("--link-rate must be >= 0 Gbit/s, got {}", o.link_rate);
  if (!(o.m_scale > 0)) throw_invalid("--m-scale must be > 0, got {}", o.m_scale);
  if (o.poll_us < 1) throw_invalid("--comm-poll-us must be >= 1, got {}", o.poll_us);
  Plan plan;
  plan.ops = parse_list(o.ops, bench_ops(), "--ops");
  plan.Ns = parse_parallel_nums(o.parallel_num);
  plan.algos = parse_list(o.comm_algos, {"collective", "p2p"}, "--coc-comm-algo");
  plan.engines = parse_list(o.engines, {"inline", "thread"}, "--engine");
  plan.T = world_size();
  plan.rank = world_rank();
  plan.file = load_problems(o.inputs, plan.T, o.m_scale, o.problem);
  if (!o.problem.empty() && plan.file.problems.empty())
    throw_invalid("--problem '{}' is not in '{}'", o.problem, o.inputs);
  check_ops_offered(o, plan);
  for (const auto& p : plan.file.problems) plan.name_w = std::max(plan.name_w, static_cast<int>(p.name.size()));
  return plan;
}

/// The number of rows the run will go through (for the progress line).
int count_rows(const OverlapOptions& o, const Plan& plan) {
  int total = 0;
  for (const auto& p : plan.file.problems)
    for (const auto& op : p.ops)
      if (plan.selects(o, p, op))
        total += static_cast<int>(plan.engines.size() * plan.Ns.size() * plan.algos.size() * (o.fused ? 2 : 1));
  return total;
}

/// Rank 0: the table's title and column heads.
void print_header(const OverlapOptions& o, const Plan& plan) {
  std::printf("coc bench overlap: %s (%s), shapes per rank for tp=%d, run on tp=%d; %d reps (+%d warmup), "
              "times in ms: median over reps, max over ranks\n",
              plan.file.model.c_str(), o.inputs.c_str(), plan.file.tp, plan.T, o.reps, o.warmup);
  if (o.dtype == "bf16")
    std::printf("dtype bf16: bf16 GEMMs (fp32 accumulation) and bf16 on the wire, 2 bytes per element (fp32: 4)\n");
  std::printf("%-*s %-14s %-6s %4s %-10s %-5s %6s %5s %5s | %8s %8s %8s %8s %8s %17s %8s | %5s %6s %8s %6s %6s %5s "
              "%6s %3s\n",
              plan.name_w, "problem", "op", "engine", "N", "algo", "fused", "m", "k", "n", "T_gemm", "T_comm",
              "T_link", "T_serial", "T_overl", "(min..max)", "T_ideal", "S", "E_norm", "exposed", "delta", "sigma",
              "E_cap", "pipe", "fb");
  std::fflush(stdout);
}

/// The row's buffers (weight, full product, input, gathered input, output), fp32: refuses a shape that cannot fit
/// rather than die in the allocator.
void check_fits_memory(const Problem& p, const std::string& op) {
  const double m = static_cast<double>(p.m), k = static_cast<double>(p.k), n = static_cast<double>(p.n);
  const double need = 4.0 * (k * n + 2.0 * m * n + 2.0 * m * k);
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > have)
    throw_invalid("problem '{}' ({}: m={} k={} n={}) needs {:.1f} GiB of buffers per rank, more than this "
                  "machine's {:.1f} GiB; lower its m, k or n, or --m-scale",
                  p.name, op, p.m, p.k, p.n, need / (1 << 30), have / (1 << 30));
}

/// One (problem, op) on T ranks: its buffers, the collective's per-rank counts and displacements (elements), the
/// collective's bytes and T_link (s).
struct OpCase {
  const Problem& p;
  const std::string& op;
  bool ag, rs;
  Buffers b;
  std::vector<int64_t> counts, displs;
  double bytes = 0, t_link = 0;

  /// The unsplit GEMM's input: [m, k].
  ConstMatrixView gemm_in() const { return ag ? b.gathered.mat() : b.a.mat(); }
};

/// Allocates and fills the buffers of `c` (the same seeds on every run) and sets its counts, bytes and T_link.
void prepare_case(OpCase& c, int T, int tp_rank, int rank, double link_rate, bool bf16) {
  const Problem& p = c.p;
  const RowRange share = split_rows(p.m, T, tp_rank);
  Buffers& b = c.b;
  b.w = Tensor({p.k, p.n});
  fill(b.w, 2);
  b.full = Tensor({p.m, p.n});
  if (c.ag) {
    b.a = Tensor({share.count, p.k});
    b.gathered = Tensor({p.m, p.k});
    b.out = Tensor({p.m, p.n});
    fill(b.gathered, 1);
  } else {
    b.a = Tensor({p.m, p.k});
    b.out = Tensor({c.rs ? share.count : p.m, p.n});
  }
  fill(b.a, 1 + static_cast<uint64_t>(rank));
  if (bf16) {
    auto twin = [](const Tensor& t) {
      std::vector<BFloat16> v(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)));
      if (t.numel() > 0) fp32_to_bf16(t.data(), v.data(), t.numel());
      return v;
    };
    b.full16 = twin(b.full);
    b.out16 = twin(b.out);
    b.a16 = twin(b.a);
    b.gathered16 = twin(b.gathered);
  }
  // Bytes of the collective (whole message, as nccl-tests' "size"): AR/RS reduce [m, n], AG gathers [m, k]; 2 bytes
  // per element under --dtype bf16.
  c.bytes = (bf16 ? 2.0 : 4.0) * static_cast<double>(p.m) * static_cast<double>(c.ag ? p.k : p.n);
  const double link_factor = c.op == "all_reduce" ? 2.0 * (T - 1) / T : static_cast<double>(T - 1) / T;
  c.t_link = link_rate > 0 ? c.bytes * link_factor / (link_rate * 1e9 / 8) : 0.0;
  c.counts.assign(static_cast<size_t>(T), 0);
  c.displs.assign(static_cast<size_t>(T), 0);
  for (int r = 0; r < T; ++r) {
    const RowRange s = split_rows(p.m, T, r);
    c.counts[static_cast<size_t>(r)] = s.count * (c.ag ? p.k : p.n);
    c.displs[static_cast<size_t>(r)] = s.begin * (c.ag ? p.k : p.n);
  }
}

/// The figures of one row, per rank the median (min, max) over reps, then the max over ranks.
struct RowTimes {
  Sample gemm, comm, serial, chunks, overlap, gemm_inside;
  double fallbacks = 0;  ///< serial and fused fallbacks per call, max over ranks
};

/// The derived figures (docs/performance.md) from the row's times and its T_link.
Figures figures(const RowTimes& t, double t_link) {
  Figures f{};
  f.t_gemm = t.gemm.median;
  f.t_comm = t.comm.median;
  f.t_link = t_link;
  f.t_serial = t.serial.median;
  f.t_ideal = std::max(f.t_gemm, f.t_comm);
  f.S = f.t_serial / t.overlap.median;
  f.S_star = f.t_serial / f.t_ideal;
  const double hideable = std::min(f.t_gemm, f.t_comm);
  f.E_norm = hideable > 0 ? (f.t_serial - t.overlap.median) / hideable : 0.0;
  f.E_flux = f.t_comm > 0 ? (f.t_serial - t.overlap.median) / f.t_comm : 0.0;
  f.exposed = t.overlap.median - f.t_gemm;
  f.delta = t.chunks.median / f.t_gemm - 1.0;
  f.sigma = t.gemm_inside.median / t.chunks.median - 1.0;
  // The op cannot beat its own GEMM as slowed by chunking and by the communication on its core, nor the
  // transfer: what it takes beyond that is the schedule's.
  const double t_floor = std::max(t.gemm_inside.median, f.t_comm);
  f.E_cap = hideable > 0 ? (f.t_serial - t_floor) / hideable : 0.0;
  f.pipeline_loss = t.overlap.median - t_floor;
  return f;
}

/// What one row ran: its schedule as asked (N, --coc-comm-algo, fused) and as run (algo_label, the auto choice,
/// the effective chunks).
struct RowId {
  const std::string& engine;
  int N;
  std::string label, algo_label;
  bool fused;
  std::optional<CocAutoChoice> choice;
  int chunks;
};

/// The serial baseline's collective as chosen for one engine: both candidates' times and which one runs.
struct CommChoice {
  Sample nonblocking, blocking;
  bool use_blocking = false;
};

/// The row as a JSON object of the --json record.
json row_json(const OverlapOptions& o, const OpCase& c, const RowId& id, const CommChoice& cc, const RowTimes& t,
              const Figures& f) {
  const Problem& p = c.p;
  return {{"problem", p.name},
          {"layer", p.layer},
          {"op", c.op},
          {"engine", id.engine},
          {"N", id.N == CocOptions::kAuto ? json("auto") : json(id.N)},
          {"algo", id.algo_label},
          {"auto_choice", id.choice ? json{{"parallel_num", id.choice->parallel_num},
                                           {"algo", to_string(id.choice->algo)},
                                           {"fused", id.choice->fused},
                                           {"reason", id.choice->reason},
                                           {"candidates_ms", id.choice->candidates_ms}}
                                    : json(nullptr)},
          {"effective_chunks", id.chunks},
          {"fused", id.fused},
          {"m", p.m},
          {"k", p.k},
          {"n", p.n},
          {"bytes", c.bytes},
          {"t_gemm_ms", t.gemm.to_json_ms()},
          {"t_comm_ms", t.comm.to_json_ms()},
          {"t_comm_collective", cc.use_blocking ? "blocking" : "non-blocking"},
          {"t_comm_nonblocking_ms", cc.nonblocking.to_json_ms()},
          {"t_comm_blocking_ms", cc.blocking.to_json_ms()},
          {"t_link_ms", o.link_rate > 0 ? json(c.t_link * 1e3) : json(nullptr)},
          {"t_serial_ms", t.serial.to_json_ms()},
          {"t_overlap_ms", t.overlap.to_json_ms()},
          {"t_ideal_ms", f.t_ideal * 1e3},
          {"t_chunk_gemms_ms", t.chunks.to_json_ms()},
          {"t_gemm_inside_overlap_ms", t.gemm_inside.to_json_ms()},
          {"S", f.S},
          {"S_star", f.S_star},
          {"E_norm", f.E_norm},
          {"E_flux", f.E_flux},
          {"exposed_comm_ms", f.exposed * 1e3},
          {"delta", f.delta},
          {"sigma", f.sigma},
          {"E_norm_cap", f.E_cap},
          {"pipeline_loss_ms", f.pipeline_loss * 1e3},
          {"fallbacks", static_cast<int64_t>(t.fallbacks)}};
}

/// Rank 0: the row as a line of the table.
void print_row(const OverlapOptions& o, const Plan& plan, const OpCase& c, const RowId& id, const RowTimes& t,
               const Figures& f) {
  const Problem& p = c.p;
  std::printf("%-*s %-14s %-6s %4s %-10s %-5s %6lld %5lld %5lld | %8s %8s %8s %8s %8s %17s %8s | %5.2f "
              "%6.2f %8s %6.3f %6.3f %5.2f %6s %3lld\n",
              plan.name_w, p.name.c_str(), c.op.c_str(), id.engine.c_str(), id.label.c_str(), id.algo_label.c_str(),
              id.fused ? "yes" : "no",
              static_cast<long long>(p.m), static_cast<long long>(p.k), static_cast<long long>(p.n),
              ms(f.t_gemm).c_str(), ms(f.t_comm).c_str(), o.link_rate > 0 ? ms(c.t_link).c_str() : "-",
              ms(f.t_serial).c_str(), ms(t.overlap.median).c_str(),
              fmt::format("({}..{})", ms(t.overlap.min), ms(t.overlap.max)).c_str(),
              ms(f.t_ideal).c_str(), f.S, f.E_norm, ms(f.exposed).c_str(), f.delta, f.sigma, f.E_cap,
              fmt::format("{:.1f}", f.pipeline_loss * 1e3).c_str(), static_cast<long long>(t.fallbacks));
  std::fflush(stdout);
}

/// The rows of one (problem, op) on one engine's communicator `tp`: the serial baseline's collective first, then
/// one row per N, --coc-comm-algo and fused setting. Collective over `tp`.
class EngineRows {
 public:
  EngineRows(const OverlapOptions& o, const Plan& plan, OpCase& c, Communicator& tp, const std::string& engine)
      : o_(o), plan_(plan), c_(c), tp_(tp), engine_(engine) {}

  /// Measures every row, prints it (rank 0) and appends it to `rows`.
  void run(Progress& progress, json& rows) {
    choose_collective();
    for (int N : plan_.Ns) {
      for (size_t ai = 0; ai < plan_.algos.size(); ++ai)
        for (int fused = 0; fused <= (o_.fused ? 1 : 0); ++fused) {
          const std::string label = N == CocOptions::kAuto ? "auto" : std::to_string(N);
          progress.step(fmt::format("{} {} {} N={} {}{}", c_.p.name, c_.op, engine_, label, plan_.algos[ai],
                                    fused ? " fused" : ""));
          // One row per distinct schedule: the fused kernel ignores the algorithm and the automatic choice picks
          // its own, so those rows run once (with the first --coc-comm-algo); p2p exists with N > 1 only.
          if ((fused || N == CocOptions::kAuto) && ai > 0) continue;
          if (plan_.algos[ai] == "p2p" && N == 1 && !fused) continue;
          measure_row(N, label, plan_.algos[ai], fused != 0, rows);
        }
    }
  }

 private:
  /// The baseline collective on fp32 or bf16 buffers (Buffers' twins): non-blocking, or the blocking MPI call
  /// (the all-gather then in place, MPI_IN_PLACE: this rank's share is read from its place in `gathered`).
  template <typename E>
  Work post(E* full, E* out, E* a, E* gathered, bool blocking) {
    if (c_.op == "all_reduce") return tp_.all_reduce(full, c_.p.m * c_.p.n, ReduceOp::kSum, "bench T_comm", blocking);
    if (c_.rs) return tp_.reduce_scatter(full, out, c_.counts, "bench T_comm", blocking);
    if (!blocking) return tp_.all_gather(a, gathered, c_.counts, c_.displs, "bench T_comm");
    return tp_.all_gather(gathered + c_.displs[static_cast<size_t>(tp_.rank())], gathered, c_.counts, c_.displs,
                          "bench T_comm", /*blocking=*/true);
  }
  void post_and_wait(bool blocking) {
    Buffers& b = c_.b;
    Work wk = b.wire16() ? post(b.full16.data(), b.out16.data(), b.a16.data(), b.gathered16.data(), blocking)
                         : post(b.full.data(), b.out.data(), b.a.data(), b.gathered.data(), blocking);
    wk.wait();
  }
  void nonblocking() { post_and_wait(false); }
  void blocking() { post_and_wait(true); }
  void collective() { cc_.use_blocking ? blocking() : nonblocking(); }

  /// The serial baseline uses the best MPI collective: the non-blocking call coc's ops post (through the engine)
  /// or the blocking one, whichever is faster here. Open MPI's large MPI_Iallreduce (and, with
  /// --comm-nonblocking-impl mpi, its MPI_Ireduce_scatter) is several times slower than the blocking call
  /// (docs/performance.md), and a baseline built on it would flatter every overlapped path. Decided once per op;
  /// each row then times its own baselines.
  void choose_collective() {
    cc_.nonblocking = reduce_sample(tp_, time_reps(tp_, o_.warmup, o_.reps, [&] { nonblocking(); }));
    cc_.blocking = reduce_sample(tp_, time_reps(tp_, o_.warmup, o_.reps, [&] { blocking(); }));
    cc_.use_blocking = cc_.blocking.median < cc_.nonblocking.median;
    if (c_.ag) {  // MPI_IN_PLACE all-gather reads this rank's share from its place in the gathered buffer
      const auto me = static_cast<size_t>(tp_.rank());
      std::copy(c_.b.a.data(), c_.b.a.data() + c_.counts[me], c_.b.gathered.data() + c_.displs[me]);
      if (c_.b.wire16())
        std::copy(c_.b.a16.begin(), c_.b.a16.begin() + c_.counts[me], c_.b.gathered16.begin() + c_.displs[me]);
    }
  }

  void serial() {
    if (c_.ag) {
      collective();
      matmul(c_.b.gathered.mat(), c_.b.w.mat(), WeightLayout::kKN, c_.b.out.mat());
    } else {
      matmul(c_.b.a.mat(), c_.b.w.mat(), WeightLayout::kKN, c_.b.full.mat());
      collective();
    }
  }

  void run_op(const CocOptions& co) {
    Buffers& b = c_.b;
    if (c_.op == "all_reduce")
      matmul_all_reduce(tp_, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
    else if (c_.rs)
      matmul_reduce_scatter(tp_, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
    else
      all_gather_matmul(tp_, b.a.mat(), b.w.mat(), WeightLayout::kKN, b.out.mat(), nullptr, co);
  }

  /// Σ T_gemm(chunk): the op's chunk GEMMs alone, with the op's row plan (contiguous chunks of all m rows for the
  /// all-reduce, one GEMM per rank sub-block for reduce-scatter and all-gather).
  void chunk_gemms(const ChunkPlan& plan) {
    const ConstMatrixView in = c_.gemm_in();
    for (int ch = 0; ch < plan.chunks(); ++ch) {
      if (c_.ag || c_.rs) {
        for (int r = 0; r < plan_.T; ++r) {
          const RowRange s = plan.sub(r, ch);
          if (s.count > 0)
            matmul(in.slice_rows(s.begin, s.count), c_.b.w.mat(), WeightLayout::kKN,
                   c_.b.full.mat().slice_rows(s.begin, s.count));
        }
      } else {
        const RowRange s = plan.contiguous(ch);
        matmul(in.slice_rows(s.begin, s.count), c_.b.w.mat(), WeightLayout::kKN,
               c_.b.full.mat().slice_rows(s.begin, s.count));
      }
    }
  }

  /// The auto row: times the candidates now, untimed, for this engine's communicator, and says what it chose.
  void tune_auto(const CocOptions& co, RowId& id) {
    coc_auto_forget();
    run_op(co);
    if (const auto all = coc_auto_choices(); !all.empty()) id.choice = all.back();
    if (id.choice && id.choice->fused)
      id.algo_label = "fused";  // on one node the fused kernel runs and N is a placeholder
    else if (id.choice)  // off-node the fused kernel falls back to the timed choice
      id.algo_label = id.choice->parallel_num == 1
                          ? std::string("->serial")
                          : fmt::format("->{}{}", id.choice->parallel_num,
                                        id.choice->algo == CocCommAlgo::kP2p ? "p2p" : "coll");
  }

  /// Every figure of the row from the same rounds: GEMM alone, collective alone, the serial pair, the chunk GEMMs
  /// and the overlapped op, interleaved (time_interleaved), so that E_norm and σ compare times taken seconds
  /// apart, not minutes.
  RowTimes time_row(CocOptions& co, const ChunkPlan& plan) {
    std::vector<double> gemm_inside;
    int64_t fallbacks = 0;
    int calls = 0;
    auto overlapped = [&] {
      CocStats st;
      co.stats = &st;
      run_op(co);
      if (++calls > o_.warmup) {
        gemm_inside.push_back(st.gemm_s);
        fallbacks = st.serial_fallbacks + fused_fallbacks(st);  // per call: the schedule is deterministic
      }
    };
    auto gemm_alone = [&] { matmul(c_.gemm_in(), c_.b.w.mat(), WeightLayout::kKN, c_.b.full.mat()); };
    const auto times = time_interleaved(tp_, o_.warmup, o_.reps,
                                        {gemm_alone, [&] { collective(); }, [&] { serial(); },
                                         [&] { chunk_gemms(plan); }, overlapped});
    RowTimes t;
    t.gemm = reduce_sample(tp_, times[0]);
    t.comm = reduce_sample(tp_, times[1]);
    t.serial = reduce_sample(tp_, times[2]);
    t.chunks = reduce_sample(tp_, times[3]);
    t.overlap = reduce_sample(tp_, times[4]);
    t.gemm_inside = reduce_sample(tp_, gemm_inside);
    t.fallbacks = tp_.all_reduce_value(static_cast<double>(fallbacks), ReduceOp::kMax, "bench fallbacks");
    return t;
  }

  void measure_row(int N, const std::string& label, const std::string& algo, bool fused, json& rows) {
    CocOptions co;
    co.parallel_num = N;
    co.comm_algo = algo == "p2p" ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
    co.fused = fused;
    co.comm_dtype = c_.b.wire16() ? DType::kBF16 : DType::kF32;
    co.tag = "bench " + c_.p.name;
    RowId id{engine_, N, label, fused ? "fused" : algo, fused, std::nullopt, 0};
    const bool auto_n = N == CocOptions::kAuto;
    if (auto_n) tune_auto(co, id);
    const int n_run = auto_n ? (id.choice && !id.choice->fused ? id.choice->parallel_num : 1) : N;
    const ChunkPlan plan(c_.p.m, c_.ag || c_.rs ? plan_.T : 1, n_run);
    id.chunks = plan.chunks();
    const RowTimes t = time_row(co, plan);
    const Figures f = figures(t, c_.t_link);
    rows.push_back(row_json(o_, c_, id, cc_, t, f));
    if (plan_.rank == 0) print_row(o_, plan_, c_, id, t, f);
  }

  const OverlapOptions& o_;
  const Plan& plan_;
  OpCase& c_;
  Communicator& tp_;
  const std::string& engine_;
  CommChoice cc_;
};

/// The --json record (and the --plot input): the run's arguments, environment and rows.
json run_record(const OverlapOptions& o, const Plan& plan, const json& env, const json& rows) {
  return {{"command", "bench overlap"},
          {"inputs", o.inputs},
          {"model", plan.file.model},
          {"tp_of_shapes", plan.file.tp},
          {"tp", plan.T},
          {"reps", o.reps},
          {"warmup", o.warmup},
          {"coc_parallel_num", o.parallel_num},
          {"coc_comm_algo", plan.algos},
          {"engines", plan.engines},
          {"comm_poll_us", o.poll_us},
          {"comm_nonblocking_impl", o.nonblocking_impl},
          {"m_scale", o.m_scale},
          {"dtype", o.dtype},
          {"statistic",
           "per rank: median (min, max) over reps; then max over ranks; each row's T_gemm, T_comm, T_serial "
           "and chunk GEMMs timed in the same rounds as its op, interleaved"},
          {"environment", env},
          {"rows", rows}};
}

}  // namespace

int run_overlap(const OverlapOptions& o) {
  // --fp16 trains on the fp32 kernels and sends fp32 messages (docs/mixed-precision.md): its ops are fp32's.
  if (o.dtype == "fp16")
    throw_invalid("coc bench overlap: --dtype fp16 has no rows of its own: --fp16 multiplies on the fp32 kernels "
                  "and sends fp32 messages (docs/mixed-precision.md), so its overlap is --dtype fp32's");
  if (o.dtype.find(',') != std::string::npos)
    throw_invalid("coc bench overlap: --dtype takes one type per run, got '{}': run it once with fp32 and once with "
                  "bf16",
                  o.dtype);
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw_invalid("coc bench overlap: --dtype must be fp32 or bf16, got '{}'", o.dtype);
  const bool bf16 = o.dtype == "bf16";
  const Plan plan = make_plan(o);
  set_blas_threads(1);
  // Every GEMM of the run (the ops', T_gemm's and the baselines') in bf16 with fp32 accumulation, as --bf16 trains.
  const DType saved_compute = gemm_compute_type();
  if (bf16) set_gemm_compute_type(DType::kBF16);
  struct Restore {
    DType t;
    ~Restore() { set_gemm_compute_type(t); }
  } restore{saved_compute};

  // One process group set per engine (every rank builds them in the same order: collective).
  std::vector<Mesh> groups = groups_per_engine(plan.engines, plan.T, o.poll_us, o.nonblocking_impl);
  Communicator& world = *groups[0].world;
  {
    const std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", o.inputs, o.ops, o.parallel_num, o.engines, o.reps,
                    o.warmup, o.m_scale, o.fused, o.problem, o.comm_algos, o.nonblocking_impl, o.dtype);
    world.check_same(fnv1a(key.data(), key.size()), "the coc bench overlap arguments");
  }
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  if (!o.plot.empty()) check_writable(world, o.plot, "--plot");
  json env = environment(world, o.link_rate);

  Progress progress(plan.rank, count_rows(o, plan));
  if (plan.rank == 0) print_header(o, plan);

  json rows = json::array();
  for (const auto& p : plan.file.problems)
    for (const auto& op : p.ops) {
      if (!plan.selects(o, p, op)) continue;
      check_fits_memory(p, op);
      OpCase c{p, op, op == "all_gather", op == "reduce_scatter", {}, {}, {}, 0.0, 0.0};
      prepare_case(c, plan.T, groups[0].tp->rank(), plan.rank, o.link_rate, bf16);
      for (size_t ei = 0; ei < plan.engines.size(); ++ei)
        EngineRows(o, plan, c, *groups[ei].tp, plan.engines[ei]).run(progress, rows);
    }
  if (plan.rank == 0) {
    const json record = run_record(o, plan, env, rows);
    if (!o.json.empty()) write_json(o.json, record);
    if (!o.plot.empty()) write_overlap_svg(o.plot, record);
  }
  return 0;
}

}  // namespace coc::cli::bench
