// --coc-parallel-num auto: the choice of N and of the communication schedule, per op and shape.
//
// Why timing and not a model: whether overlap pays depends on the link (shared memory, a shaped 1 Gbit/s link, an
// unshaped one), on the MPI library's algorithms and progress, and on how much CPU its transport steals from the
// GEMM (σ, docs/performance.md). All of these are cheaper to measure than to predict. So the first call of each shape
// on a communicator runs the real op once per candidate (serial, N ∈ {4, 8, 16}, collective and point-to-point), in
// three interleaved rounds, then serial and the two fastest overlap candidates in two more (a run-off), and keeps
// the lowest median. Medians, not minima: on a VM whose speed drifts, one candidate's lucky run in a fast spell
// used to win over a better one (MPICH's all-gather at 192 KB segments chose a schedule 0.06 E_norm worse; at 64 KB
// the reduce-scatter chose N=4 over N=8, 0.56 against 0.78). Every candidate computes the same output, so the
// tuning calls are ordinary work, not a side benchmark; they cost ~25 op-times once per shape.
//
// Rules that hold without timing (edge cases 11 and 12 of docs/edge-cases.md):
//  - tp = 1 or m = 0: nothing to communicate.
//  - tiny m (fewer than 2·kMinChunkRows rows per rank): chunks that small cost more per chunk than they hide.
//  - every TP rank on one node: the collective is copy work on the GEMM's own core and overlap only interleaves
//    it (docs/performance.md, "Prototypes": 0.6–1.0× serial); serial, and --coc-fused-kernel is the way to win there.
// A timed overlap candidate wins only if it is at least kMinGain faster than serial, so that run-to-run noise can
// never make the choice lose more than that noise. 10%, not 5%: on the unshaped link a 5%-faster candidate (the
// all-reduce at N = 4, 8% in tuning) ran 9% slower than serial in the same benchmark, the VM's spread there being
// 20-40%; where overlap pays (the 1 Gbit/s link) the winners are 1.2-1.9x serial. Rank 0 decides from the
// max-over-ranks times and broadcasts the choice, so every rank runs the same schedule even if their clocks
// disagree. The choice is cached per
// (communicator, op, m, agreed dimension, deterministic), logged in verbose mode, and recorded in the profiler
// trace as a "coc_auto_choice" host event. Agreeing on the dimension takes an all-reduce, which also makes the
// ranks wait for each other, so a second cache answers repeated calls without it: keyed by the call site (the op's
// tag) and facts every rank shares (op, m, full dimension), it hits or misses on every rank alike, since every rank
// makes the same calls in the same order. (Measured on the shaped cluster: 13 such all-reduces per iteration cost
// 167 ms of a 2 s step, exposed, before the second cache.)
//
// With --coc-tuning-cache FILE (overlap/tuning_cache.h) a timed choice is stored under its shape, group size, link,
// MPI library and coc version, and a later run takes it from the file instead of timing; rank 0's lookup decides
// and is broadcast, so the group agrees as it does on a timed choice.
//
// MindSpeed has no automatic choice: its CoC uses a fixed --coc-parallel-num and a per-shape table
// (customized_coc in mindspeed/core/tensor_parallel/lcal_coc/user_config.py), which --coc-parallel-num still is.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "coc/comm/process.h"
#include "coc/comm/shm_window.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/core/median.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/tuning_cache.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc {

namespace {
constexpr int64_t kMinChunkRows = 64;
constexpr double kMinGain = 0.10;
constexpr int kRounds = 3;        // every candidate
constexpr int kRunoffRounds = 2;  // serial and the two fastest overlap candidates
constexpr size_t kRunoffSize = 2;
constexpr int kCandidateN[] = {4, 8, 16};

std::mutex g_mu;
std::map<std::string, CocAutoChoice> g_cache;
std::vector<CocAutoChoice> g_order;  // in the order they were made
/// Call site → the choice made there: (parallel_num, algo), keyed without the rank's own dimension (see above).
std::map<std::string, std::pair<int, CocCommAlgo>> g_site;

std::string label_of(int n, CocCommAlgo algo) {
  return n == 1 ? std::string("serial") : fmt::format("N={} {}", n, to_string(algo));
}

// --coc-tuning-cache: the entry rank 0 finds for this shape and setting, broadcast so the group agrees (every rank
// holds the same file, but one decision is cheaper to trust than many). Sets `key` whenever a cache is open, so
// that a timed choice can be stored under it. Collective over `tp` when a cache is open.
std::optional<TuningEntry> cached_choice(Communicator& tp, const char* op, int64_t m, int64_t dim, int64_t dim2,
                                         const CocOptions& opts, bool has_p2p, std::optional<TuningEntry>& key) {
  const std::shared_ptr<TuningCache> cache = tuning_cache();
  if (!cache) return std::nullopt;
  // All-gather ops agree on the gathered k and own n; the others agree on n and own k (resolve_auto).
  const bool gathers = std::string_view(op).starts_with("all_gather");
  TuningEntry k;
  k.op = op;
  k.m = m;
  k.k = gathers ? dim : dim2;
  k.n = gathers ? dim2 : dim;
  k.deterministic = opts.deterministic;
  // bf16 GEMMs run about twice as fast and a bf16 wire moves half the bytes: another problem, timed on its own.
  k.gemm_dtype = to_string(gemm_compute_type());
  k.comm_dtype = to_string(opts.comm_dtype);
  k.group_size = tp.size();
  k.link = link_fingerprint(tp);
  k.mpi_library = library_version();
  // The version names the tuner too, so that a binary whose candidates or rules differ never takes another's choice
  // (the project version alone changes only at releases).
  std::string ns;
  for (int n : kCandidateN) ns += fmt::format("{}{}", ns.empty() ? "" : ",", n);
  k.coc_version = fmt::format("{} (auto: serial, N {{{}}}{}, {}+{} rounds, gain {:.0f}%)", COC_VERSION, ns,
                              has_p2p ? " collective and p2p" : " collective", kRounds, kRunoffRounds, kMinGain * 100);
  std::optional<TuningEntry> hit = cache->find(k);
  int32_t pick[3] = {hit ? 1 : 0, hit ? hit->parallel_num : 1, hit && hit->algo == CocCommAlgo::kP2p ? 1 : 0};
  tp.broadcast_bytes(pick, sizeof pick, 0, "tuning cache choice").wait();
  if (!pick[0] && tp.rank() == 0 && cache->has_other_setting(k))
    log::verbose("--coc-tuning-cache {}: {} m={} k={} n={} has entries for another link, MPI library, group size or "
                 "coc version only: timing it again",
                 cache->path(), op, m, k.k, k.n);
  key = k;
  if (!pick[0]) return std::nullopt;
  TuningEntry e = hit ? *hit : k;
  e.parallel_num = pick[1];
  e.algo = pick[2] ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
  return e;
}

// Stores a timed choice under `key` and writes the file (world rank 0); a failed write costs the next run its
// timing, not this run: it is a warning.
void remember(TuningEntry key, const CocAutoChoice& ch) {
  const std::shared_ptr<TuningCache> cache = tuning_cache();
  if (!cache) return;
  key.parallel_num = ch.parallel_num;
  key.algo = ch.algo;
  key.candidates_ms = ch.candidates_ms;
  cache->store(std::move(key));
  try {
    cache->save();
  } catch (const Error& e) {
    log::warn("{}; the choices stay in effect for this run", e.what());
  }
}
}  // namespace

std::shared_ptr<const std::map<std::array<int64_t, 3>, int>> parse_customized_coc(const std::string& text) {
  std::string body = text;
  if (!text.empty() && text[0] == '@') {
    const std::string path = text.substr(1);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw_invalid("--customized-coc: '{}' is a directory; pass @FILE, a JSON file", path);
    std::ifstream f(path);
    if (!f) throw_invalid("--customized-coc: cannot read '{}'", path);
    try {
      body.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const std::exception& e) {  // libstdc++ throws from the buffer on read errors
      throw_invalid("--customized-coc: cannot read '{}' ({})", path, e.what());
    }
  }
  const char* example = "e.g. '{\"[4096, 1024, 1024]\": 8, \"[4096, 1024, 512]\": \"auto\"}'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    throw_invalid("--customized-coc is not JSON ({}); {}", e.what(), example);
  }
  if (!j.is_object()) throw_invalid("--customized-coc must be a JSON object of \"[m, k, n]\": N; {}", example);
  auto table = std::make_shared<std::map<std::array<int64_t, 3>, int>>();
  for (const auto& [key, value] : j.items()) {
    std::array<int64_t, 3> shape{};
    nlohmann::json k;
    try {
      k = nlohmann::json::parse(key);
    } catch (...) {
    }
    if (!k.is_array() || k.size() != 3 || !k[0].is_number_integer() || !k[1].is_number_integer() ||
        !k[2].is_number_integer() || k[0].get<int64_t>() < 1 || k[1].get<int64_t>() < 1 || k[2].get<int64_t>() < 1)
      throw_invalid("--customized-coc key '{}' is not a shape \"[m, k, n]\" of three positive integers; {}", key,
                    example);
    for (size_t i = 0; i < 3; ++i) shape[i] = k[i].get<int64_t>();
    int n = 0;
    if (value.is_string() && value.get<std::string>() == "auto")
      n = CocOptions::kAuto;
    else if (value.is_number_integer() && value.get<int64_t>() >= 1 && value.get<int64_t>() <= 4096)
      n = value.get<int>();
    else
      throw_invalid("--customized-coc value of '{}' is {}; use an N from 1 to 4096 or \"auto\"", key, value.dump());
    (*table)[shape] = n;
  }
  return table;
}

std::vector<CocAutoChoice> coc_auto_choices() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_order;
}

void coc_auto_forget() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cache.clear();
  g_order.clear();
  g_site.clear();
}

namespace detail {

CocOptions apply_customized(const CocOptions& opts, int64_t m, int64_t k, int64_t n) {
  CocOptions o = opts;
  o.customized.reset();
  if (!opts.customized) return o;
  if (auto it = opts.customized->find({m, k, n}); it != opts.customized->end()) o.parallel_num = it->second;
  return o;
}

namespace {

/// A timed candidate schedule and its max-over-ranks times in ms, one per round.
struct Cand {
  int n;
  CocCommAlgo algo;
  std::vector<double> ms;
  double median() const { return ms.empty() ? 1e300 : coc::median(ms); }
};

/// Serial first, then every N of kCandidateN that leaves at least kMinChunkRows rows per chunk, collective and (when
/// the op has one) point-to-point.
std::vector<Cand> candidates(int64_t rows_per_rank, bool has_p2p) {
  std::vector<Cand> cands{{1, CocCommAlgo::kCollective, {}}};
  for (int n : kCandidateN) {
    if (rows_per_rank / n < kMinChunkRows) continue;
    cands.push_back({n, CocCommAlgo::kCollective, {}});
    if (has_p2p) cands.push_back({n, CocCommAlgo::kP2p, {}});
  }
  return cands;
}

/// One round: runs the op once per candidate of `which`, between barriers, and appends each one's max-over-ranks
/// time. Collective over `tp`.
void time_round(Communicator& tp, CocOptions& trial, const std::function<void(const CocOptions&)>& run,
                const std::vector<Cand*>& which) {
  for (Cand* c : which) {
    trial.parallel_num = c->n;
    trial.comm_algo = c->algo;
    tp.barrier("auto-tune");
    const auto t0 = std::chrono::steady_clock::now();
    run(trial);
    float ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
    tp.all_reduce(&ms, 1, ReduceOp::kMax, "auto-tune time", /*blocking=*/true).wait();
    c->ms.push_back(ms);
  }
}

/// Rank 0's pick among serial (cands[0]) and the run-off, broadcast so every rank takes it: the lowest median,
/// unless it beats serial by less than kMinGain. Collective over `tp`.
std::pair<int, CocCommAlgo> pick_best(Communicator& tp, const std::vector<Cand>& cands,
                                      const std::vector<Cand*>& runoff) {
  int32_t pick[2] = {1, 0};
  if (tp.rank() == 0) {
    const Cand* best = &cands[0];
    for (const Cand* c : runoff)
      if (c->median() < best->median()) best = c;
    if (best->n != 1 && best->median() > cands[0].median() * (1 - kMinGain)) best = &cands[0];
    pick[0] = best->n;
    pick[1] = best->algo == CocCommAlgo::kP2p ? 1 : 0;
  }
  tp.broadcast_bytes(pick, sizeof pick, 0, "auto-tune choice").wait();
  return {pick[0], pick[1] ? CocCommAlgo::kP2p : CocCommAlgo::kCollective};
}

/// The timed choice (see the top of this file): every candidate in kRounds rounds, then serial and the kRunoffSize
/// fastest in kRunoffRounds more; sets ch's parallel_num, algo, candidates_ms and reason. Collective over `tp`.
void time_candidates(Communicator& tp, int64_t rows_per_rank, bool has_p2p, const CocOptions& opts,
                     const std::function<void(const CocOptions&)>& run, const std::function<void()>& before_trials,
                     CocAutoChoice& ch) {
  // Identical on every rank: m, rows_per_rank and opts are agreed.
  std::vector<Cand> cands = candidates(rows_per_rank, has_p2p);
  CocOptions trial = opts;
  trial.stats = nullptr;  // tuning runs are real work but not the caller's op
  trial.during_gather = nullptr;  // the caller's independent work runs once, in the real call
  trial.produce_rows = nullptr;   // before_trials produced every row: the trials time the op alone
  trial.finish_rows = nullptr;    // the real call finishes the rows it computes
  trial.tag = opts.tag.empty() ? std::string("auto-tune") : opts.tag + " (auto-tune)";
  std::vector<Cand*> all;
  for (auto& c : cands) all.push_back(&c);
  if (before_trials) before_trials();
  for (int round = 0; round < kRounds; ++round) time_round(tp, trial, run, all);
  // The run-off: the times are max-over-ranks, identical on every rank, so every rank picks the same set.
  std::vector<Cand*> runoff(all.begin() + 1, all.end());
  std::stable_sort(runoff.begin(), runoff.end(),
                   [](const Cand* x, const Cand* y) { return x->median() < y->median(); });
  if (runoff.size() > kRunoffSize) runoff.resize(kRunoffSize);
  runoff.insert(runoff.begin(), &cands[0]);
  if (runoff.size() > 1)
    for (int round = 0; round < kRunoffRounds; ++round) time_round(tp, trial, run, runoff);
  std::tie(ch.parallel_num, ch.algo) = pick_best(tp, cands, runoff);
  double chosen_ms = cands[0].median();
  for (const auto& c : cands) {
    ch.candidates_ms.emplace_back(label_of(c.n, c.algo), c.median());
    if (c.n == ch.parallel_num && c.algo == ch.algo) chosen_ms = c.median();
  }
  ch.reason = ch.parallel_num == 1
                  ? fmt::format("timed: no overlap candidate was {:.0f}% faster than serial (medians)",
                                kMinGain * 100)
                  : fmt::format("timed: the lowest median, {:.2f}x serial",
                                cands[0].median() / std::max(1e-9, chosen_ms));
}

/// Makes the choice for ch's op, m, dim and local_dim: by the rules that hold without timing, else from the tuning
/// cache, else timed (and stored in the cache). Collective over `tp` as far as the rule reached needs.
void choose(Communicator& tp, int64_t rows_per_rank, bool has_p2p, const CocOptions& opts,
            const std::function<void(const CocOptions&)>& run, const std::function<void()>& before_trials,
            CocAutoChoice& ch) {
  std::optional<TuningEntry> cache_key;  // set when a tuning cache is open
  // Decided from facts every rank shares, so no agreement is needed for these.
  if (tp.size() == 1 || ch.m == 0) {
    ch.reason = "nothing to communicate (tp=1 or m=0)";
  } else if (opts.fused && tp.shm_window().node_local()) {  // before the tiny-m rule: that one is about chunking
    ch.parallel_num = 4;  // the fused kernel ignores N
    ch.fused = true;
    ch.reason = "the fused node-shared kernel runs (--coc-fused-kernel); N is not used";
  } else if (rows_per_rank < 2 * kMinChunkRows) {
    ch.reason = fmt::format("tiny m: {} rows per rank, < 2 chunks of {} rows; chunking would cost more than it hides",
                            rows_per_rank, kMinChunkRows);
  } else if (tp.shm_window().node_local() && !env::get_bool(env::Var::kTestAutoTimed)) {
    ch.reason = "the tp ranks share one node: the collective is copy work on the GEMM's own core, so overlap only "
                "interleaves it (docs/performance.md); --coc-fused-kernel removes the copies instead";
  } else if (std::optional<TuningEntry> hit = cached_choice(tp, ch.op.c_str(), ch.m, ch.dim, ch.local_dim, opts,
                                                            has_p2p, cache_key)) {
    ch.parallel_num = hit->parallel_num;
    ch.algo = hit->algo;
    ch.candidates_ms = hit->candidates_ms;
    ch.from_cache = true;
    ch.reason = fmt::format("from the tuning cache {} (timed by an earlier run on this link and library)",
                            tuning_cache()->path());
  } else {
    // The timed candidates, under their own span.
    trace::Scope timing(trace::Cat::kHost, trace::Level::kLevel0, trace::kAutoTimingEvent);
    time_candidates(tp, rows_per_rank, has_p2p, opts, run, before_trials, ch);
    if (cache_key) remember(*cache_key, ch);
  }
}

/// Records the choice in the profiler trace (`span`, a trace::kAutoChoiceEvent) and, in verbose mode, in the log
/// (rank 0).
void report_choice(trace::Scope& span, const CocAutoChoice& ch, const CocOptions& opts, int T, int rank) {
  if (span.on()) {
    span.args({{"m", ch.m},
               {"N", ch.fused ? 0 : ch.parallel_num},
               {"p2p", ch.algo == CocCommAlgo::kP2p ? 1 : 0},
               {"fused", ch.fused ? 1 : 0}});
    span.label("choice", fmt::format("{} {}", ch.op,
                                     ch.fused ? std::string("fused kernel") : label_of(ch.parallel_num, ch.algo)));
  }
  if (log::level() >= 2 && rank == 0) {
    std::string times;
    for (const auto& [l, ms] : ch.candidates_ms) times += fmt::format("{}{} {:.1f} ms", times.empty() ? "" : ", ", l, ms);
    // All-gather: dim is the gathered k, the per-rank dimension n; the others: dim is n, the per-rank one k.
    const bool gathers = std::string_view(ch.op).starts_with("all_gather");
    log::verbose("coc auto {}{}: m={} {}={} {} per rank={} tp={}: {} ({}){}{}", ch.op,
                 opts.tag.empty() ? "" : " '" + opts.tag + "'", ch.m, gathers ? "k" : "n", ch.dim, gathers ? "n" : "k",
                 ch.local_dim, T, ch.fused ? std::string("fused kernel") : label_of(ch.parallel_num, ch.algo),
                 ch.reason, times.empty() ? "" : "; ", times);
  }
}

}  // namespace

CocOptions resolve_auto(Communicator& tp, const char* op, int64_t m, int64_t dim, int64_t local_dim,
                        int64_t rows_per_rank, bool has_p2p, const CocOptions& opts,
                        const std::function<void(const CocOptions&)>& run,
                        const std::function<void()>& before_trials) {
  // The per-rank dimension (k of a row-parallel GEMM, n of a column-parallel one) sets the GEMM time, so it is part
  // of the shape; it may differ between ranks (uneven splits), so the key uses its maximum, which every rank agrees
  // on. One 8-byte all-reduce per call: a hit on one rank and a miss on another would otherwise deadlock.
  // A bf16 wire halves the bytes, so it may choose otherwise: its own entries (fp32 keys unchanged).
  const char* wire = opts.comm_dtype == DType::kF32 ? "" : "|bf16";
  // Keyed by the communicator's serial, not its address: a later communicator at a freed one's address on some ranks
  // only would hit the cache there and skip the shape-key all-reduce below that the others run.
  const std::string site = fmt::format("{}@{}|{}|{}|{}|{}|{}{}", tp.name(), tp.serial(), op, opts.tag, m, dim,
                                       opts.deterministic ? 1 : 0, wire);
  CocOptions out = opts;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_site.find(site); it != g_site.end()) {
      out.parallel_num = it->second.first;
      out.comm_algo = it->second.second;
      return out;
    }
  }
  int64_t dim2 = local_dim;
  if (tp.size() > 1)
    dim2 = tp.all_reduce_value(dim2, ReduceOp::kMax, "auto-tune shape key");
  const std::string key = fmt::format("{}@{}|{}|{}|{}|{}|{}{}", tp.name(), tp.serial(), op, m, dim, dim2,
                                      opts.deterministic ? 1 : 0, wire);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_cache.find(key); it != g_cache.end()) {
      out.parallel_num = it->second.parallel_num;
      out.comm_algo = it->second.algo;
      g_site[site] = {out.parallel_num, out.comm_algo};
      return out;
    }
  }
  trace::Scope span(trace::Cat::kHost, trace::Level::kLevel0, trace::kAutoChoiceEvent);
  CocAutoChoice ch;
  ch.op = op;
  ch.comm = tp.name();
  ch.m = m;
  ch.dim = dim;
  ch.local_dim = dim2;
  choose(tp, rows_per_rank, has_p2p, opts, run, before_trials, ch);
  report_choice(span, ch, opts, tp.size(), tp.rank());
  out.parallel_num = ch.parallel_num;
  out.comm_algo = ch.algo;
  std::lock_guard<std::mutex> lock(g_mu);
  g_site[site] = {out.parallel_num, out.comm_algo};
  g_cache.emplace(key, ch);
  g_order.push_back(std::move(ch));
  return out;
}

}  // namespace detail
}  // namespace coc
