// Several files or folders: expand, analyse in parallel (one std::thread per file slot), refuse duplicate ranks
// (edge case 26 of docs/edge-cases.md), and compute the cross-rank figures: the balance of step and compute times, and
// the waits for a later rank (metrics_wait.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <map>
#include <thread>

#include "coc/analysis/analyze.h"
#include "coc/core/error.h"
#include "metrics.h"

namespace coc::analysis {

namespace {

bool is_trace_name(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t n = std::char_traits<char>::length(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends(".json") || ends(".json.gz");
}

std::vector<std::string> expand(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec) && is_trace_name(it->path().filename().string())) found.push_back(it->path().string());
      }
      if (ec) throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: cannot list folder: {}", p, ec.message()), true);
      if (found.empty())
        throw Error(ErrorKind::kInvalidArgument,
                    fmt::format("{}: no trace files (*.json, *.json.gz) in this folder", p), true);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);  // analyze_file reports a missing or unreadable file with its name
    }
  }
  return files;
}

// msprof-analyze's slow-rank rule: the largest more than 5% above the smallest.
bool exceeds_by_5pct(int64_t lo, int64_t hi) { return static_cast<double>(hi) > static_cast<double>(lo) * 1.05; }

int64_t step_time(const RankReport& r) {
  if (r.steps.empty()) return r.total.split.window;
  int64_t sum = 0;
  for (const StepReport& s : r.steps) sum += s.split.window;
  return sum / static_cast<int64_t>(r.steps.size());
}

}  // namespace

Report analyze_paths(const std::vector<std::string>& paths, const AnalyzeOptions& opt) {
  const std::vector<std::string> files = expand(paths);
  std::vector<std::vector<RankReport>> results(files.size());
  std::vector<std::exception_ptr> errors(files.size());
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>(files.size(), opt.threads > 0 ? static_cast<size_t>(opt.threads) : hw);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      try {
        results[i] = analyze_file(files[i], opt);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);  // the first failing file in the given order: never a partial report

  Report rep;
  rep.convention = opt.convention;
  for (auto& v : results)
    for (RankReport& r : v) rep.ranks.push_back(std::move(r));
  std::stable_sort(rep.ranks.begin(), rep.ranks.end(), [](const RankReport& a, const RankReport& b) {
    return (a.rank < 0) != (b.rank < 0) ? a.rank >= 0 : a.rank < b.rank;
  });
  for (size_t i = 1; i < rep.ranks.size(); ++i) {
    const RankReport &a = rep.ranks[i - 1], &b = rep.ranks[i];
    // Traces of different formats are different runs (`coc analyze coc_profile/ torch_profile/` puts coc's rank 0
    // beside PyTorch's rank 0); within one format a rank is claimed once.
    if (a.rank >= 0 && a.rank == b.rank && a.format == b.format)
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("duplicate rank {}: {} and {} both claim it; analyse them separately or map each file "
                              "to its rank (FILE=RANK)",
                              a.rank, a.file, b.file),
                  true);
  }

  // Balance: a slow rank when the slowest mean step is more than 5% above the fastest. Only within one run: with
  // traces of several formats there is no balance to speak of.
  bool one_format = true;
  for (const RankReport& r : rep.ranks) one_format = one_format && r.format == rep.ranks.front().format;
  int64_t lo = 0, hi = 0;
  for (const RankReport& r : rep.ranks) {
    if (!r.has_device_activity || !one_format) continue;
    const int64_t t = step_time(r);
    if (t <= 0) continue;
    if (rep.fastest_rank < 0 || t < lo) lo = t, rep.fastest_rank = r.rank;
    if (rep.slowest_rank < 0 || t > hi) hi = t, rep.slowest_rank = r.rank;
  }
  rep.slow_rank = rep.fastest_rank >= 0 && exceeds_by_5pct(lo, hi);
  for (const RankReport& r : rep.ranks) {
    if (!r.has_device_activity || !one_format || rep.fastest_rank < 0) continue;
    const int64_t c = r.total.split.computing;
    if (rep.least_compute_rank < 0 || c < rep.least_compute_ns) {
      rep.least_compute_rank = r.rank;
      rep.least_compute_ns = c;
    }
    if (rep.most_compute_rank < 0 || c > rep.most_compute_ns) {
      rep.most_compute_rank = r.rank;
      rep.most_compute_ns = c;
    }
  }
  rep.unequal_compute = rep.least_compute_rank >= 0 && exceeds_by_5pct(rep.least_compute_ns, rep.most_compute_ns);
  detail::fill_late_waits(rep.ranks);

  std::map<std::string, KernelStat> all;
  for (const RankReport& r : rep.ranks)
    for (const KernelStat& k : r.top_kernels) {
      KernelStat& a = all[k.name];
      a.name = k.name;
      a.kind = k.kind;
      a.count += k.count;
      a.total_ns += k.total_ns;
    }
  for (auto& [name, k] : all) rep.top_kernels.push_back(k);
  std::sort(rep.top_kernels.begin(), rep.top_kernels.end(),
            [](const KernelStat& a, const KernelStat& b) { return a.total_ns > b.total_ns; });
  if (opt.top_kernels >= 0 && rep.top_kernels.size() > static_cast<size_t>(opt.top_kernels))
    rep.top_kernels.resize(static_cast<size_t>(opt.top_kernels));
  return rep;
}

}  // namespace coc::analysis
