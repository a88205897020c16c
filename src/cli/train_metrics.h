// `coc train --log-json FILE --tensorboard-dir DIR`: machine-readable metrics, written as training goes (each
// record flushed when its iteration is logged, so that a killed run keeps what it logged). Rank 0 writes both; every
// rank contributes its own GEMM, communication-wait, exposed-communication time and memory to each record.
//
// JSON lines (FILE, or "-" for standard output, which then carries nothing else: see redirect_stdout_to_stderr):
// first {"type": "run", ...} with the run's settings, then one {"type": "iteration", ...} per logged iteration (every
// --log-interval iterations and the last) with every field of the log line (load_balancing_loss for a MoE model,
// tflops_per_rank) and "ranks": [{rank, gemm_ms, comm_wait_ms, exposed_comm_ms, max_rss_mib}, ...], and one
// {"type": "evaluation", "split": "validation"|"test", "iteration", "loss", "ppl", "at_end"} per evaluation.
// `coc plot` reads these files. TensorBoard (tensorboard_writer.h): Megatron's scalar names "lm loss",
// "learning-rate", "grad-norm", "iteration-time" (seconds, as Megatron logs it), "throughput" (TFLOP/s per rank, as
// Megatron's), "load_balancing_loss" (MoE), and coc's "tokens-per-second"; each evaluation as Megatron's
// evaluate_and_print_results writes it: "lm loss validation" and "lm loss validation ppl" at the iteration, and the
// same "... vs samples" at the samples trained, for the test split too (Megatron's tags do not tell the splits
// apart; the JSON does), and nothing under --skip-train (Megatron's write_to_tensorboard=not skip_train).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

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

/// `--log-json -`: makes standard output the JSON records' alone, so that `coc train ... --log-json - | coc plot -`
/// reads nothing else. Moves this process's stdout (fd 1) to a new descriptor and points fd 1 at stderr, so that the
/// log lines, the sample and any library's printf land on stderr; returns a FILE on the saved descriptor (rank 0
/// writes the records to it; the other ranks close it). Call before anything is printed, on every rank (mpirun
/// merges every rank's stdout into its own). A kIo error naming --log-json when a descriptor cannot be duplicated.
std::FILE* redirect_stdout_to_stderr();

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
  void on_evaluation(const EvalLog& e);
  void write_json(const nlohmann::ordered_json& j);
  MetricsOptions o_;
  int64_t log_interval_ = 1, train_iters_ = 0, global_batch_size_ = 0;
  bool skip_train_ = false, moe_ = false;
  std::shared_ptr<ProgressEngine> engine_;
  std::unique_ptr<Communicator> world_;
  std::FILE* json_ = nullptr;  ///< rank 0's --log-json FILE, or the moved standard output
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace coc::cli
