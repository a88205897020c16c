// Shared pieces of `coc bench overlap` and `coc bench comm`: per-rank timing statistics reduced over ranks, the
// environment record every JSON result carries, list-flag parsing and the stderr progress line.
//
// Statistics (docs/performance.md, "How overlap is measured"): per figure and rank, the median over repetitions (with
// min and max as the spread), then the maximum over ranks (the slowest rank finishes the op).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/comm/communicator.h"

namespace coc::cli::bench {

/// Median, min and max of one figure in seconds, already reduced over ranks (max of each).
struct Sample {
  double median = 0, min = 0, max = 0;
  nlohmann::json to_json_ms() const;  ///< {"median": ms, "min": ms, "max": ms}
};

/// Median/min/max of this rank's repetition times (seconds), then the max of each over `comm`'s ranks
/// (collective). `times` must be non-empty.
Sample reduce_sample(Communicator& comm, std::vector<double> times);

/// Runs `body` `warmup` times untimed, then `reps` times, each after a barrier on `comm` so that every rank
/// starts together; returns this rank's per-repetition seconds.
template <typename F>
std::vector<double> time_reps(Communicator& comm, int warmup, int reps, F&& body);

/// Runs each of `bodies` once per round, each after a barrier on `comm`: `warmup` untimed rounds, then `reps`
/// timed ones; round r starts with body r mod B and goes on in order, so no body always follows the same one.
/// Returns this rank's seconds per body and timed round: result[b][r]. Why interleave: the VMs these benchmarks
/// run on drift by up to ±30% in speed over seconds (docs/performance.md); a figure such as
/// E_norm = (T_serial − T_overlap) / T_comm subtracts two times, and timing them minutes apart measured the drift.
std::vector<std::vector<double>> time_interleaved(Communicator& comm, int warmup, int reps,
                                                  const std::vector<std::function<void()>>& bodies);

/// The environment of a benchmark record: MPI vendor and version, thread level, per-rank binding, CPU model, BLAS
/// config and kernels (who chose them: coc/kernels/blas_core.h),
/// link rate ("shared-memory" when none was given), git revision (or "unknown"), UTC date, hosts. Collective over
/// `world` (gathers every rank's binding); meaningful on rank 0.
nlohmann::json environment(Communicator& world, double link_rate_gbit);

/// "a,b,c" → {"a","b","c"}; each must be in `allowed` (else a uniform error naming `flag` and the choices).
std::vector<std::string> parse_list(const std::string& s, const std::vector<std::string>& allowed,
                                    const std::string& flag);
/// "1,2,4,8" → {1,2,4,8}; each >= 1 (else a uniform error naming `flag`).
std::vector<int> parse_int_list(const std::string& s, const std::string& flag);

/// One set of process groups (world = tp = all `world_size` ranks) per progress engine named in `engines`
/// ("inline", "thread"), built in the same order on every rank (collective): each engine gets its own communicators.
std::vector<Mesh> groups_per_engine(const std::vector<std::string>& engines, int world_size, int poll_us,
                                    const std::string& nonblocking_impl);

/// Fails early, on every rank, when rank 0 cannot create `path` (a uniform error naming `flag`), instead of
/// after minutes of measuring; leaves no file behind that was not there. Collective over `world`.
void check_writable(Communicator& world, const std::string& path, const std::string& flag);

/// Writes `j` (pretty-printed) to `path` on rank 0; throws kIo naming the path when it cannot.
void write_json(const std::string& path, const nlohmann::json& j);

/// One-line progress on stderr ("\r[3/12] what"), rank 0 only, and only when stderr is a terminal.
class Progress {
 public:
  Progress(int rank, int total);
  void step(const std::string& what);
  ~Progress();  ///< clears the line

 private:
  bool on_ = false;
  int done_ = 0, total_ = 0;
};

// ---- template definition ------------------------------------------------------------------------------------

template <typename F>
std::vector<double> time_reps(Communicator& comm, int warmup, int reps, F&& body) {
  for (int i = 0; i < warmup; ++i) {
    comm.barrier("bench warmup");
    body();
  }
  std::vector<double> t;
  t.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    comm.barrier("bench rep");
    const auto t0 = std::chrono::steady_clock::now();
    body();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return t;
}

}  // namespace coc::cli::bench
