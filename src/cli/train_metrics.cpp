#include "cli/train_metrics.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/tensorboard_writer.h"
#include "coc/core/error.h"
#include "coc/overlap/coc_ops.h"

namespace coc::cli {

void add_metrics_flags(CLI::App* cmd, MetricsOptions& o) {
  cmd->add_option("--log-json", o.log_json,
                  "Write one JSON object per logged iteration (every field of the log line, and each rank's GEMM, "
                  "communication-wait and exposed-communication ms and peak memory) and one per evaluation to FILE ('-': "
                  "stdout, and the log goes to stderr, so that `coc train ... --log-json - | coc plot -` works), "
                  "flushed as it goes; `coc plot FILE` draws it");
  cmd->add_option("--tensorboard-dir", o.tensorboard_dir,
                  "Write TensorBoard event files to DIR with Megatron's scalar names (lm loss, learning-rate, "
                  "grad-norm, iteration-time, throughput in TFLOP/s per rank, lm loss validation, ...; tokens/s as "
                  "tokens-per-second), flushed as it goes");
}

std::FILE* redirect_stdout_to_stderr() {
  std::fflush(stdout);
  const int saved = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (saved < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
    throw_error(ErrorKind::kIo, "--log-json -: cannot move the log off standard output: {}; pass --log-json FILE",
                std::strerror(errno));
  std::FILE* f = ::fdopen(saved, "w");
  if (!f)
    throw_error(ErrorKind::kIo, "--log-json -: cannot reopen standard output: {}; pass --log-json FILE",
                std::strerror(errno));
  return f;
}

TrainMetrics::TrainMetrics(const MetricsOptions& o, const CommOptions& copts, TrainConfig& cfg) : o_(o) {
  if (o.log_json.empty() && o.tensorboard_dir.empty()) return;
  log_interval_ = std::max<int64_t>(1, cfg.log_interval);
  train_iters_ = cfg.train_iters;
  global_batch_size_ = cfg.global_batch_size;
  skip_train_ = cfg.skip_train;
  moe_ = cfg.model.is_moe();
  // Every rank: mpirun merges all ranks' stdout into its own, so one stray line from any rank would break the pipe.
  std::FILE* json_stdout = o.log_json == "-" ? redirect_stdout_to_stderr() : nullptr;
  engine_ = std::make_shared<ProgressEngine>(EngineKind::kInline, copts.poll_us);
  world_ = Communicator::world("metrics", engine_, copts);
  if (json_stdout && world_->rank() != 0) std::fclose(json_stdout);
  if (world_->rank() == 0) {
    if (!o.log_json.empty()) {
      json_ = json_stdout ? json_stdout : std::fopen(o.log_json.c_str(), "w");
      if (!json_)
        throw_error(ErrorKind::kIo, "--log-json {}: cannot write the file: {}; check that its folder exists and is "
                    "writable", o.log_json, std::strerror(errno));
      nlohmann::ordered_json run = {
          {"type", "run"},
          {"world_size", world_->size()},
          {"tensor_model_parallel_size", cfg.tensor_model_parallel_size},
          {"pipeline_model_parallel_size", cfg.pipeline_model_parallel_size},
          {"sequence_parallel", cfg.sequence_parallel},
          {"coc_parallel_num", cfg.coc_parallel_num == CocOptions::kAuto ? nlohmann::ordered_json("auto")
                                                                         : nlohmann::ordered_json(cfg.coc_parallel_num)},
          {"coc_comm_algo", to_string(cfg.coc_comm_algo)},
          {"deterministic", cfg.deterministic},
          {"micro_batch_size", cfg.micro_batch_size},
          {"global_batch_size", cfg.global_batch_size},
          {"seq_length", cfg.model.seq_length},
          {"train_iters", cfg.train_iters},
          {"log_interval", cfg.log_interval},
          {"seed", cfg.seed}};
      write_json(run);
    }
    if (!o.tensorboard_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(o.tensorboard_dir);
  }
  cfg.on_iteration = [this](const IterationLog& rec) { on_iteration(rec); };
  cfg.on_evaluation = [this](const EvalLog& e) { on_evaluation(e); };
}

TrainMetrics::~TrainMetrics() {
  if (json_) std::fclose(json_);
}

void TrainMetrics::write_json(const nlohmann::ordered_json& j) {
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), json_) != line.size() || std::fflush(json_) != 0)
    throw_error(ErrorKind::kIo, "--log-json {}: cannot write: {} (disk full?)", o_.log_json, std::strerror(errno));
}

void TrainMetrics::on_evaluation(const EvalLog& e) {
  if (world_->rank() != 0) return;  // the loss is the same on every rank
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (json_)
    write_json({{"type", "evaluation"}, {"split", e.split == Split::kTest ? "test" : "validation"},
                {"iteration", e.iteration}, {"loss", e.loss}, {"ppl", e.ppl()}, {"at_end", e.at_end},
                {"wall_time", now}});
  if (!tb_ || skip_train_) return;
  const int64_t samples = e.iteration * global_batch_size_;
  tb_->add_scalar("lm loss validation", static_cast<float>(e.loss), e.iteration, now);
  tb_->add_scalar("lm loss validation vs samples", static_cast<float>(e.loss), samples, now);
  tb_->add_scalar("lm loss validation ppl", static_cast<float>(e.ppl()), e.iteration, now);
  tb_->add_scalar("lm loss validation ppl vs samples", static_cast<float>(e.ppl()), samples, now);
}

void TrainMetrics::on_iteration(const IterationLog& rec) {
  if (rec.iteration % log_interval_ != 0 && rec.iteration != train_iters_) return;  // as the log line
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  constexpr int kFields = 4;
  const float mine[kFields] = {static_cast<float>(rec.gemm_ms), static_cast<float>(rec.comm_wait_ms),
                               static_cast<float>(rec.exposed_comm_ms), static_cast<float>(ru.ru_maxrss / 1024.0)};
  const int P = world_->size();
  std::vector<float> all(static_cast<size_t>(P) * kFields);
  std::vector<int64_t> counts(P, kFields), displs(P);
  for (int r = 0; r < P; ++r) displs[r] = int64_t{r} * kFields;
  // Between iterations the trainer has nothing in flight, so its engine (a sleeping comm thread at most) makes no
  // MPI call alongside this one: MPI_THREAD_SERIALIZED holds with two engines.
  world_->all_gather(mine, all.data(), counts, displs, "metrics", /*blocking=*/true).wait();
  if (world_->rank() != 0) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (json_) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int r = 0; r < P; ++r) {
      const float* v = &all[static_cast<size_t>(r) * kFields];
      ranks.push_back({{"rank", r}, {"gemm_ms", v[0]}, {"comm_wait_ms", v[1]}, {"exposed_comm_ms", v[2]},
                       {"max_rss_mib", v[3]}});
    }
    nlohmann::ordered_json j = {{"type", "iteration"},   {"iteration", rec.iteration},
                                {"train_iters", train_iters_}, {"loss", rec.loss},
                                {"lr", rec.lr},           {"grad_norm", rec.grad_norm},
                                {"elapsed_ms", rec.elapsed_ms}, {"tokens_per_s", rec.tokens_per_s},
                                {"tflops_per_rank", rec.tflops_per_rank},
                                {"baseline", rec.baseline}, {"wall_time", now},
                                {"ranks", ranks}};
    if (rec.loss_scale > 0) {  // --fp16
      j["loss_scale"] = rec.loss_scale;
      j["skipped"] = rec.skipped;
      j["skipped_iterations"] = rec.skipped_iterations;
    }
    if (moe_) j["load_balancing_loss"] = rec.load_balancing_loss;
    write_json(j);
  }
  if (tb_) {
    tb_->add_scalar("lm loss", static_cast<float>(rec.loss), rec.iteration, now);
    tb_->add_scalar("learning-rate", static_cast<float>(rec.lr), rec.iteration, now);
    tb_->add_scalar("grad-norm", static_cast<float>(rec.grad_norm), rec.iteration, now);
    if (rec.loss_scale > 0) tb_->add_scalar("loss-scale", static_cast<float>(rec.loss_scale), rec.iteration, now);
    tb_->add_scalar("iteration-time", static_cast<float>(rec.elapsed_ms / 1000.0), rec.iteration, now);
    tb_->add_scalar("throughput", static_cast<float>(rec.tflops_per_rank), rec.iteration, now);
    tb_->add_scalar("tokens-per-second", static_cast<float>(rec.tokens_per_s), rec.iteration, now);
    if (moe_) tb_->add_scalar("load_balancing_loss", static_cast<float>(rec.load_balancing_loss), rec.iteration, now);
  }
}

}  // namespace coc::cli
