// `coc train --log-json FILE --tensorboard-dir DIR`: machine-readable metrics, written as training goes (each
// record flushed when its iteration is logged, so that a killed run keeps what it logged). Rank 0 writes both; every
// rank contributes its own GEMM, communication-wait, exposed-communication time and memory to each record.
//
// JSON lines (FILE, or "-" for standard output): first {"type": "run", ...} with the run's settings, then one
// {"type": "iteration", ...} per logged iteration (every --log-interval iterations and the last) with every field
// of the log line and "ranks": [{rank, gemm_ms, comm_wait_ms, exposed_comm_ms, max_rss_mib}, ...]. `coc plot`
// reads these files. TensorBoard (tensorboard_writer.h): Megatron's scalar names "lm loss", "learning-rate",
// "grad-norm", "iteration-time" (seconds, as Megatron logs it) and "throughput" (tokens per second).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "coc/comm/communicator.h"
#include "coc/model/trainer.h"

namespace coc::cli {

class TensorBoardWriter;

struct MetricsOptions {
  std::string log_json;         ///< --log-json FILE ("-": stdout)
  std::string tensorboard_dir;  ///< --tensorboard-dir DIR
};

/// Registers --log-json and --tensorboard-dir on `cmd`.
void add_metrics_flags(CLI::App* cmd, MetricsOptions& o);

/// Owns the metrics files of one `coc train` run. Collective over MPI_COMM_WORLD: construct on every rank; the
/// callback it installs in cfg.on_iteration gathers each logged iteration's per-rank figures to rank 0.
class TrainMetrics {
 public:
  /// Opens the files on rank 0 (a kIo error naming the file when it cannot), writes the "run" record and sets
  /// cfg.on_iteration. Does nothing when neither flag is given.
  TrainMetrics(const MetricsOptions& o, const CommOptions& copts, TrainConfig& cfg);
  ~TrainMetrics();

 private:
  void on_iteration(const IterationLog& rec);
  MetricsOptions o_;
  int64_t log_interval_ = 1, train_iters_ = 0;
  std::shared_ptr<ProgressEngine> engine_;
  std::unique_ptr<Communicator> world_;
  std::FILE* json_ = nullptr;
  bool json_is_stdout_ = false;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace coc::cli
