#include "coc/model/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/model/checkpoint.h"
#include "coc/model/dataset.h"
#include "coc/model/decoder.h"
#include "coc/overlap/coc_ops.h"
#include "coc/parallel/context.h"

namespace coc {

namespace {

using Clock = std::chrono::steady_clock;

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

/// Bytes of activations one rank keeps for backward (fp32), a rough upper bound used to refuse batches that do not
/// fit before allocating them.
int64_t activation_bytes(const ModelConfig& c, int64_t mbs, int tp) {
  const int64_t m = c.seq_length * mbs, H = c.hidden_size, F = c.ffn_hidden_size / tp, Hl = H / tp;
  const int64_t per_layer = m * (6 * H + 3 * Hl + Hl + 2 * F + F + 2 * H) + mbs * (c.num_attention_heads / tp) *
                                                                                 c.seq_length * c.seq_length;
  return 4 * (c.num_layers * per_layer + 3 * m * c.vocab_size / tp + 4 * m * H);
}

void validate(const TrainConfig& c, int world) {
  const int tp = c.tensor_model_parallel_size;
  if (tp < 1) throw_invalid("--tensor-model-parallel-size must be >= 1 (got {})", tp);
  if (world % tp != 0)
    throw_invalid("world size {} is not divisible by --tensor-model-parallel-size {}; launch a multiple of {} ranks "
                  "(scripts/launch -n {} -- ...) or change the tp size",
                  world, tp, tp, tp);
  if (c.coc_parallel_num < 1 && c.coc_parallel_num != CocOptions::kAuto)
    throw_invalid("--coc-parallel-num must be >= 1 or auto (got {}); use 1 for the plain Megatron order, 2-16 to "
                  "overlap communication with computation, or auto to let coc time the choices per shape",
                  c.coc_parallel_num);
  ParallelContext::check_fused_flags(c.coc_fused_kernel, c.use_mc2, c.sequence_parallel);
  if (!c.customized_coc.empty()) parse_customized_coc(c.customized_coc);  // a bad table fails before any work
  if (c.coc_min_chunk_rows < 1) throw_invalid("--coc-min-chunk-rows must be >= 1 (got {})", c.coc_min_chunk_rows);
  if (c.micro_batch_size < 1) throw_invalid("--micro-batch-size must be >= 1 (got {})", c.micro_batch_size);
  if (c.global_batch_size < 1) throw_invalid("--global-batch-size must be >= 1 (got {})", c.global_batch_size);
  const int dp = world / tp;
  if (c.global_batch_size % (c.micro_batch_size * dp) != 0)
    throw_invalid("--global-batch-size {} is not divisible by --micro-batch-size {} × data-parallel size {} (= world "
                  "{} / tp {}); use a global batch that is a multiple of {}",
                  c.global_batch_size, c.micro_batch_size, dp, world, tp, c.micro_batch_size * dp);
  if (c.train_iters < 0) throw_invalid("--train-iters must be >= 0 (got {})", c.train_iters);
  if (c.log_interval < 1) throw_invalid("--log-interval must be >= 1 (got {})", c.log_interval);
  if (c.save_interval < 0) throw_invalid("--save-interval must be >= 0 (got {})", c.save_interval);
  if (c.save_interval > 0 && c.save.empty())
    throw_invalid("--save-interval {} needs --save DIR to know where to write checkpoints", c.save_interval);
  if (c.sample_length < 0) throw_invalid("--sample-length must be >= 0 (got {})", c.sample_length);
  if (!(c.sample_temperature > 0)) throw_invalid("--sample-temperature must be > 0");
  c.model.validate(tp);
  coc::validate(c.optim);
  const int64_t need = activation_bytes(c.model, c.micro_batch_size, tp) +
                       3 * 4 * c.model.num_parameters() / tp * 2;  // params, grads, Adam m and v
  const int64_t avail = mem_available_bytes();
  if (avail > 0 && need > avail)
    throw_invalid("--seq-length {} × --micro-batch-size {} does not fit: each rank needs about {:.1f} GiB of "
                  "activations and optimizer state but {:.1f} GiB is available; lower --micro-batch-size or "
                  "--seq-length, or raise --tensor-model-parallel-size",
                  c.model.seq_length, c.micro_batch_size, need / 1073741824.0, avail / 1073741824.0);
}

uint64_t config_hash(const TrainConfig& c, int world) {
  nlohmann::json j = {{"model", c.model.hash()},
                      {"tp", c.tensor_model_parallel_size},
                      {"sp", c.sequence_parallel},
                      {"N", c.coc_parallel_num},
                      {"algo", to_string(c.coc_comm_algo)},
                      {"customized", c.customized_coc},
                      {"det", c.deterministic},
                      {"fused", c.coc_fused_kernel},
                      {"mc2", c.use_mc2},
                      {"mbs", c.micro_batch_size},
                      {"gbs", c.global_batch_size},
                      {"seq", c.model.seq_length},
                      {"iters", c.train_iters},
                      {"seed", c.seed},
                      {"lr", c.optim.lr},
                      {"world", world}};
  std::string s = j.dump();
  return fnv1a(s.data(), s.size());
}

std::string progress_bar(int64_t done, int64_t total, double eta_s) {
  const int width = 30;
  int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  return fmt::format("[{}] {}/{} eta {:.0f}s", bar, done, total, eta_s);
}

/// Named tensors of a checkpoint shard: every parameter, then Adam's first and second moments.
std::vector<std::pair<std::string, Tensor*>> checkpoint_tensors(Decoder& model, AdamW& opt) {
  std::vector<std::pair<std::string, Tensor*>> t;
  ParamList ps = model.params();
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name, &ps[i]->value);
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name + ".exp_avg", &opt.exp_avg()[i]);
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name + ".exp_avg_sq", &opt.exp_avg_sq()[i]);
  return t;
}

void save_checkpoint(const TrainConfig& cfg, ProcessGroups& g, Decoder& model, AdamW& opt, int64_t iteration) {
  // Data-parallel replicas hold identical state, so only dp rank 0 writes (Megatron does the same).
  if (g.dp_rank() == 0) {
    CheckpointShard s;
    s.iteration = iteration;
    s.config_hash = cfg.model.hash();
    s.tp_rank = g.tp_rank();
    s.tp_size = g.tp_size();
    s.dp_rank = 0;
    s.meta_json = nlohmann::json{{"iteration", iteration},
                                 {"adam_step", opt.step_count()},
                                 {"seed", cfg.seed},
                                 {"model", cfg.model.shape_flags()}}
                      .dump();
    s.tensors = checkpoint_tensors(model, opt);
    save_shard(cfg.save, s);
  }
  // Every shard must be complete before `latest` points at the iteration.
  g.world->barrier("checkpoint save");
  if (g.world->rank() == 0) write_latest(cfg.save, iteration);
  g.world->barrier("checkpoint latest");
  if (g.world->rank() == 0) log::info("saved checkpoint at iteration {} to {}", iteration, cfg.save);
}

/// Fails at start-up, not after hours of training, when --save cannot be written.
void check_save_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw_invalid("--save {}: cannot create the directory ({}); pass a writable directory", dir,
                  ec ? ec.message() : "a file of that name exists");
  const std::string probe = fmt::format("{}/.coc-write-test.{}", dir, log::rank());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) throw_invalid("--save {}: the directory is not writable; pass a writable directory", dir);
  std::fclose(f);
  std::remove(probe.c_str());
}

/// Each rank reads its own checkpoint files, but a wrong --load or model flag fails the same way on every rank:
/// agree on the outcome (collective over `world`) so that such an error is reported once (a uniform error), not
/// once per rank through MPI_Abort. A failure on some ranks only stays rank-local: those ranks abort the job with
/// their message, and the others wait for that instead of printing a second error.
void agree_on_load(Communicator& world, const std::optional<Error>& failed) {
  float n_failed = failed ? 1.0f : 0.0f;
  world.all_reduce(&n_failed, 1, ReduceOp::kSum, "checkpoint load outcome", /*blocking=*/true).wait();
  if (n_failed == 0) return;
  const float kind = failed ? static_cast<float>(failed->kind()) : -1.0f;
  float kinds[2] = {kind, -kind};  // max and -min of the error kinds
  world.all_reduce(kinds, 2, ReduceOp::kMax, "checkpoint load error kinds", /*blocking=*/true).wait();
  if (failed) {
    const bool same_everywhere = n_failed == static_cast<float>(world.size()) && kinds[0] == -kinds[1];
    throw Error(failed->kind(), failed->what(), same_everywhere);
  }
  world.barrier("checkpoint load: waiting for the failing rank to abort the job");
}

int64_t load_checkpoint(const TrainConfig& cfg, ProcessGroups& g, Decoder& model, AdamW& opt) {
  std::error_code ec;
  if (!std::filesystem::is_directory(cfg.load, ec))
    throw_invalid("--load {}: {}; pass the --save directory of an earlier run", cfg.load,
                  std::filesystem::exists(cfg.load, ec) ? "not a directory" : "no such directory");
  std::optional<Error> failed;
  std::optional<int64_t> latest;
  try {
    latest = read_latest(cfg.load);
  } catch (const Error& e) {
    failed = e;
  }
  agree_on_load(*g.world, failed);
  if (!latest) {
    if (g.world->rank() == 0)
      log::warn("--load {}: no latest_checkpointed_iteration.txt; starting from scratch", cfg.load);
    return 0;
  }
  CheckpointShard s;
  s.config_hash = cfg.model.hash();
  s.tp_rank = g.tp_rank();
  s.tp_size = g.tp_size();
  s.dp_rank = 0;
  s.tensors = checkpoint_tensors(model, opt);
  s.meta_json = nlohmann::json{{"model", cfg.model.shape_flags()}}.dump();  // quoted if the configs differ
  try {
    load_shard(cfg.load, *latest, s);
  } catch (const Error& e) {
    failed = e;
  }
  agree_on_load(*g.world, failed);
  auto meta = nlohmann::json::parse(s.meta_json, nullptr, false);
  if (meta.is_discarded() || !meta.contains("adam_step"))
    throw_error(ErrorKind::kCorrupt, "rank {}: checkpoint {} has no optimizer step in its metadata; it was not written "
                "by coc train", log::rank(), checkpoint_shard_path(cfg.load, *latest, g.tp_rank(), 0));
  std::vector<Tensor> m = opt.exp_avg(), v = opt.exp_avg_sq();
  opt.load_state(std::move(m), std::move(v), meta["adam_step"].get<int64_t>());
  if (g.world->rank() == 0) log::info("resumed from {} at iteration {}", cfg.load, *latest);
  return *latest;
}

/// In-place sum of every listed gradient over `comm` (deterministic order if asked).
void all_reduce_grads(Communicator& comm, const ParamList& ps, bool deterministic, const char* what) {
  std::vector<Work> works;
  for (Param* p : ps) {
    MatrixView g{p->grad.data(), 1, p->grad.numel(), p->grad.numel()};
    works.push_back(all_reduce_rows(comm, g, deterministic, std::string(what) + " " + p->name));
  }
  wait_all(works);
}

std::string generate(Decoder& model, const TrainConfig& cfg) {
  std::vector<int32_t> ctx;
  for (unsigned char ch : cfg.sample_prompt) ctx.push_back(ch);
  if (ctx.empty()) ctx.push_back('\n');
  std::string out = cfg.sample_prompt;
  // Same seed on every rank and bitwise-identical gathered logits, so every rank samples the same bytes.
  std::mt19937_64 rng(cfg.seed ^ 0x5eedull);
  for (int64_t i = 0; i < cfg.sample_length; ++i) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(ctx.size()), cfg.model.seq_length);
    std::vector<float> logits = model.next_token_logits(ctx.data() + ctx.size() - len, len);
    float mx = -INFINITY;
    for (float l : logits) mx = std::max(mx, l);
    std::vector<double> p(logits.size());
    for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp((logits[j] - mx) / cfg.sample_temperature);
    std::discrete_distribution<int> pick(p.begin(), p.end());
    int tok = pick(rng);
    ctx.push_back(tok);
    out += static_cast<char>(tok);
  }
  return out;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, const CommOptions& copts) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  validate(cfg, world);
  if (!cfg.save.empty()) check_save_dir(cfg.save);
  ProcessGroups g = make_process_groups(cfg.tensor_model_parallel_size, copts);
  g.world->check_same(config_hash(cfg, world), "the training configuration (flags and config file)");
  const bool root = g.world->rank() == 0;

  ByteDataset data(cfg.data_path.empty() ? kDefaultDataPath : cfg.data_path, cfg.model.seq_length);
  CocStats stats;
  ParallelContext ctx;
  ctx.tp = g.tp.get();
  ctx.sequence_parallel = cfg.sequence_parallel;
  ctx.coc.parallel_num = cfg.coc_parallel_num;
  ctx.coc.comm_algo = cfg.coc_comm_algo;
  if (!cfg.customized_coc.empty()) ctx.coc.customized = parse_customized_coc(cfg.customized_coc);
  ctx.coc.deterministic = cfg.deterministic;
  ctx.coc.min_chunk_rows = cfg.coc_min_chunk_rows;
  ctx.fused_kernel = cfg.coc_fused_kernel;
  ctx.mc2 = cfg.use_mc2;
  ctx.coc.stats = &stats;
  Decoder model(cfg.model, &ctx, cfg.seed);
  ParamList params = model.params();
  AdamW opt(params, cfg.optim);

  TrainResult result;
  if (!cfg.load.empty()) result.start_iteration = load_checkpoint(cfg, g, model, opt);
  if (cfg.profiling && cfg.profile_step_end >= 0 && cfg.profile_step_end <= result.start_iteration)
    throw_invalid("--profile-step-end {} is not after iteration {}, where this run resumes: no step would be "
                  "profiled and the trace would be empty; profile iterations from {} on",
                  cfg.profile_step_end, result.start_iteration, result.start_iteration);
  if (root && result.start_iteration >= cfg.train_iters && cfg.train_iters > 0)
    log::warn("the checkpoint is at iteration {} and --train-iters is {}: nothing to train; raise --train-iters to "
              "continue",
              result.start_iteration, cfg.train_iters);
  if (root && !cfg.quiet) {
    log::info("coc train: {} ranks = tp {} × dp {}, sequence parallel {}, --coc-parallel-num {}{}{}, engine {}",
              world, g.tp_size(), g.dp_size(), cfg.sequence_parallel ? "on" : "off",
              cfg.coc_parallel_num == CocOptions::kAuto
                  ? std::string("auto")
                  : fmt::format("{} ({})", cfg.coc_parallel_num, to_string(cfg.coc_comm_algo)),
              cfg.deterministic ? " (deterministic)" : "",
              cfg.coc_fused_kernel ? ", fused kernels" : cfg.use_mc2 ? ", MC2 placement" : "", to_string(copts.engine));
    log::info("model: {} layers, hidden {}, {} heads, ffn {}, seq {}, {:.2f} M parameters; data: {}",
              cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads, cfg.model.ffn_hidden_size,
              cfg.model.seq_length, cfg.model.num_parameters() / 1e6, data.description());
  }

  const int64_t micro_batches = cfg.global_batch_size / (cfg.micro_batch_size * g.dp_size());
  const int64_t tokens_per_iter = cfg.global_batch_size * cfg.model.seq_length;
  std::vector<int32_t> tokens, targets;
  ParamList sp_params, all_params = params;
  for (Param* p : params)
    if (p->sp_partial_grad && cfg.sequence_parallel) sp_params.push_back(p);
  const auto run_start = Clock::now();
  const CocOptions coc_configured = ctx.coc;
  for (int64_t it = result.start_iteration; it < cfg.train_iters; ++it) {
    const bool serial_turn = cfg.ab_serial && it % 2 == 0;
    if (cfg.ab_serial) {
      ctx.coc = coc_configured;
      ctx.fused_kernel = cfg.coc_fused_kernel && !serial_turn;
      ctx.mc2 = cfg.use_mc2 && !serial_turn;
      if (serial_turn) {
        ctx.coc.parallel_num = 1;
        ctx.coc.customized.reset();
      }
    }
    const auto t0 = Clock::now();
    const bool profiled = it >= cfg.profile_step_start && (cfg.profile_step_end < 0 || it < cfg.profile_step_end);
    trace::StepScope step_trace(profiled ? cfg.profile_level : trace::Level::kOff, it);
    stats.reset();
    for (Param* p : params) p->grad.zero();
    double loss_sum = 0;
    for (int64_t mb = 0; mb < micro_batches; ++mb) {
      data.sample_batch(it, static_cast<int>(mb), g.dp_rank(), g.dp_size(), static_cast<int>(cfg.micro_batch_size),
                        static_cast<int>(cfg.model.seq_length), cfg.seed, tokens, targets);
      {
        COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", mb});
        loss_sum += model.forward(tokens.data(), targets.data(), cfg.micro_batch_size);
      }
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "backward", {"micro_batch", mb});
      model.backward(1.0f / static_cast<float>(micro_batches));
    }
    // Norm weights under SP saw only this rank's sequence shard: sum their gradients over TP (Megatron's
    // allreduce_sequence_parallel_grads). Then average everything over DP.
    const auto t_reduce = Clock::now();
    std::optional<trace::Scope> phase(std::in_place, trace::Cat::kHost, trace::Level::kLevel0, "grad_reduce");
    if (!sp_params.empty()) all_reduce_grads(*g.tp, sp_params, cfg.deterministic, "sp grad");
    if (g.dp_size() > 1) {
      all_reduce_grads(*g.dp, all_params, cfg.deterministic, "dp grad");
      const float inv = 1.0f / static_cast<float>(g.dp_size());
      for (Param* p : params)
        for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad[i] *= inv;
    }
    const double reduce_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_reduce).count();
    // Global grad norm: sharded parameters contribute their shard on every TP rank, replicated ones only on TP
    // rank 0 (they are identical everywhere).
    phase.emplace(trace::Cat::kHost, trace::Level::kLevel0, "optimizer");
    float sq[2] = {0.0f, 0.0f};
    double local_sq = 0;
    for (Param* p : params)
      if (!p->tp_replicated || g.tp_rank() == 0) local_sq += sum_squares(p->grad);
    sq[0] = static_cast<float>(local_sq);
    g.tp->all_reduce(sq, 1, ReduceOp::kSum, "grad norm").wait();
    const double grad_norm = std::sqrt(static_cast<double>(sq[0]));
    if (!std::isfinite(grad_norm))
      throw_invalid("the gradient norm became {} at iteration {}: training diverged; lower --lr (now {}), raise "
                    "--lr-warmup-iters or keep --clip-grad on",
                    grad_norm, it + 1, cfg.optim.lr);
    const float lr = lr_at(cfg.optim, it);
    opt.step(lr, clip_scale(grad_norm, cfg.optim.clip_grad));
    phase.reset();

    // Loss: mean over micro-batches, then over DP. Time: the slowest rank's.
    float red[2] = {static_cast<float>(loss_sum / static_cast<double>(micro_batches)), 0.0f};
    g.dp->all_reduce(red, 1, ReduceOp::kSum, "loss").wait();
    float elapsed = static_cast<float>(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    g.world->all_reduce(&elapsed, 1, ReduceOp::kMax, "iteration time").wait();
    IterationLog rec;
    rec.iteration = it + 1;
    rec.loss = red[0] / static_cast<double>(g.dp_size());
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    rec.elapsed_ms = elapsed;
    rec.tokens_per_s = tokens_per_iter / (elapsed / 1000.0);
    rec.gemm_ms = stats.gemm_s * 1000;
    rec.comm_wait_ms = stats.comm_wait_s * 1000;
    rec.exposed_comm_ms = rec.comm_wait_ms + reduce_ms;
    rec.serial = serial_turn;
    result.log.push_back(rec);
    if (!std::isfinite(rec.loss))
      throw_invalid("loss became {} at iteration {}; lower --lr (now {}) or raise --lr-warmup-iters", rec.loss,
                    rec.iteration, cfg.optim.lr);
    // The loss with every digit (%.17g round-trips a double), so that runs can be compared bit for bit.
    log::verbose("iteration {}: GEMM {:.1f} ms, waiting for communication {:.1f} ms, {} CoC calls, {} chunks, {} "
                 "serial fallbacks, loss {:.17g}",
                 rec.iteration, rec.gemm_ms, rec.comm_wait_ms, stats.calls, stats.chunks, stats.serial_fallbacks,
                 static_cast<double>(rec.loss));
    if (root && !cfg.quiet && (rec.iteration % cfg.log_interval == 0 || rec.iteration == cfg.train_iters)) {
      if (cfg.progress_bar) std::printf("\r\033[K");
      std::printf(" iteration %8lld/%8lld | loss %.4f | lr %.3E | grad norm %.3f | elapsed time per iteration (ms): "
                  "%.1f | tokens/s %.0f%s\n",
                  static_cast<long long>(rec.iteration), static_cast<long long>(cfg.train_iters), rec.loss, rec.lr,
                  rec.grad_norm, rec.elapsed_ms, rec.tokens_per_s,
                  !cfg.ab_serial ? "" : serial_turn ? " | N=1" : " | overlap");
      if (cfg.progress_bar) {
        const double spent = std::chrono::duration<double>(Clock::now() - run_start).count();
        const int64_t done = rec.iteration - result.start_iteration;
        const double eta = done > 0 ? spent / done * (cfg.train_iters - rec.iteration) : 0.0;
        std::printf("%s", progress_bar(rec.iteration, cfg.train_iters, eta).c_str());
      }
      std::fflush(stdout);
    }
    if (cfg.on_iteration) cfg.on_iteration(rec);
    if (!cfg.save.empty() && cfg.save_interval > 0 && rec.iteration % cfg.save_interval == 0)
      save_checkpoint(cfg, g, model, opt, rec.iteration);
  }
  if (root && cfg.progress_bar && !cfg.quiet) std::printf("\r\033[K");
  const int64_t final_iter = std::max(result.start_iteration, cfg.train_iters);
  if (!cfg.save.empty() && (cfg.save_interval == 0 || final_iter % cfg.save_interval != 0) &&
      final_iter > result.start_iteration)
    save_checkpoint(cfg, g, model, opt, final_iter);
  if (cfg.sample_length > 0) result.sample = generate(model, cfg);
  return result;
}

}  // namespace coc
