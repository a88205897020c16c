// `coc bench overlap|comm|w8a16|train`: registers the benchmark subcommands (bench_overlap.h, bench_comm.h,
// bench_w8a16.h, bench_train.h) and their flags.
// docs/performance.md explains how to run them and what every column means.
#include "cli/bench_comm.h"
#include "cli/bench_gemm.h"
#include "cli/bench_overlap.h"
#include "cli/bench_ring.h"
#include "cli/bench_train.h"
#include "cli/bench_w8a16.h"
#include "cli/commands.h"
#include "coc/core/log.h"

namespace coc::cli {

Runner add_bench_command(CLI::App& app) {
  auto ov = std::make_shared<bench::OverlapOptions>();
  auto cm = std::make_shared<bench::CommBenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmarks: op-level overlap figures (docs/performance.md) and "
                                              "collective bandwidth sweeps (nccl-tests style)");
  cmd->require_subcommand(1);
  CLI::App* o = cmd->add_subcommand(
      "overlap", "T_gemm, T_comm, T_serial, T_overlap, T_ideal, S, E_norm, exposed comm, delta, sigma per problem, op, "
                 "N and engine (docs/performance.md)");
  o->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  o->add_option("--inputs", ov->inputs, "Problem file (bench/inputs/*.yaml)")->capture_default_str();
  o->add_option("--ops", ov->ops, "Ops: all_reduce, reduce_scatter, all_gather (comma-separated)")
      ->capture_default_str();
  o->add_option("--coc-parallel-num", ov->parallel_num,
                "Chunk counts N (comma-separated); 'auto' adds the automatic choice (timed once per shape, untimed)")
      ->capture_default_str();
  o->add_option("--coc-comm-algo", ov->comm_algos,
                "Schedules: collective (one MPI collective per chunk), p2p (point-to-point; reduce-scatter and "
                "all-reduce remote rows first, all-gather own rows first); comma-separated")
      ->capture_default_str();
  o->add_option("--engine", ov->engines, "Progress engines: inline, thread (comma-separated)")->capture_default_str();
  o->add_option("--problem", ov->problem, "Only this problem of the file");
  o->add_option("--reps", ov->reps, "Timed repetitions per figure (median reported)")->capture_default_str();
  o->add_option("--warmup", ov->warmup, "Untimed repetitions first")->capture_default_str();
  o->add_option("--comm-poll-us", ov->poll_us, "Thread engine: sleep between MPI tests (us)")->capture_default_str();
  o->add_option("--comm-nonblocking-impl", ov->nonblocking_impl,
                "How non-blocking reduce-scatters and all-gathers are built: p2p (MPI_Isend/MPI_Irecv) or mpi "
                "(MPI_Ireduce_scatter, MPI_Iallgatherv)")
      ->capture_default_str();
  o->add_option("--link-rate", ov->link_rate, "Link bandwidth in Gbit/s: adds T_link = busiest-link bytes / rate");
  o->add_option("--m-scale", ov->m_scale, "Multiply every problem's m (tokens) by this factor")->capture_default_str();
  o->add_flag("--fused", ov->fused, "Add rows for the fused shared-memory ops (CocOptions::fused)");
  o->add_option("--dtype", ov->dtype,
                "fp32, or bf16: bf16 GEMMs and bf16 on the wire for the ops and the baseline collectives")
      ->capture_default_str();
  o->add_option("--json", ov->json, "Write the results and the environment to this JSON file");
  o->add_option("--plot", ov->plot, "Write an SVG chart (T_serial, T_overlap, T_ideal per row)");
  CLI::App* c = cmd->add_subcommand("comm", "Collective sweep over message sizes: time, algbw, busbw (nccl-tests)");
  c->add_option("--ops", cm->ops, "Collectives: all_reduce, reduce_scatter, all_gather, shm_all_reduce (node-shared, fused_ops.h)")->capture_default_str();
  c->add_option("--engine", cm->engines, "Progress engines: inline, thread")->capture_default_str();
  c->add_option("--dtype", cm->dtypes,
                "Element types: fp32, bf16, fp16 (comma-separated). Each size is an fp32 tensor of size/4 elements; "
                "a 16-bit row moves the same elements in half the bytes (sums in fp32, rounded to 16 bits)")
      ->capture_default_str();
  c->add_option("--min-bytes", cm->min_bytes, "Smallest message (bytes)")->capture_default_str();
  c->add_option("--max-bytes", cm->max_bytes, "Largest message (bytes)")->capture_default_str();
  c->add_option("--factor", cm->factor, "Size multiplier between steps")->capture_default_str();
  c->add_option("--reps", cm->reps, "Timed repetitions per size")->capture_default_str();
  c->add_option("--warmup", cm->warmup, "Untimed repetitions first")->capture_default_str();
  c->add_option("--comm-poll-us", cm->poll_us, "Thread engine: sleep between MPI tests (us)")->capture_default_str();
  c->add_option("--comm-nonblocking-impl", cm->nonblocking_impl,
                "How non-blocking reduce-scatters and all-gathers are built: p2p (MPI_Isend/MPI_Irecv) or mpi "
                "(MPI_Ireduce_scatter, MPI_Iallgatherv)")
      ->capture_default_str();
  c->add_option("--json", cm->json, "Write the results and the environment to this JSON file");
  auto wq = std::make_shared<bench::W8a16BenchOptions>();
  CLI::App* q = cmd->add_subcommand("w8a16", "The int8-weight GEMM: panel dequantisation vs dequantise-all vs sgemm");
  q->add_option("--m", wq->m, "Rows (tokens)")->capture_default_str();
  q->add_option("--k", wq->k, "In-features")->capture_default_str();
  q->add_option("--n", wq->n, "Out-features")->capture_default_str();
  q->add_option("--w8a16", wq->spec, "per-tensor, per-channel or per-group:G")->capture_default_str();
  q->add_option("--panels", wq->panels, "Panel heights to time (rows of the weight)")->capture_default_str();
  q->add_option("--reps", wq->reps, "Timed repetitions")->capture_default_str();
  q->add_option("--warmup", wq->warmup, "Untimed repetitions first")->capture_default_str();
  q->add_option("--json", wq->json, "Write the results and the environment to this JSON file");
  auto gm = std::make_shared<bench::GemmBenchOptions>();
  CLI::App* gq =
      cmd->add_subcommand("gemm", "The single-rank GEMM per back end (oneDNN, OpenBLAS) and type (fp32, bf16)");
  gq->add_option("--shapes", gm->shapes, "Problems as MxKxN, comma-separated")->capture_default_str();
  gq->add_option("--backends", gm->backends, "fp32 back ends: onednn, openblas")->capture_default_str();
  gq->add_option("--dtype", gm->dtypes, "Types: fp32, bf16 (bf16 runs on oneDNN)")->capture_default_str();
  gq->add_option("--layout", gm->layout, "Weight layout: nk ([out, in], Megatron's) or kn")->capture_default_str();
  gq->add_option("--reps", gm->reps, "Timed rounds (one call of each variant per round)")->capture_default_str();
  gq->add_option("--warmup", gm->warmup, "Untimed rounds first")->capture_default_str();
  gq->add_option("--json", gm->json, "Write the results and the environment to this JSON file");
  auto rg = std::make_shared<bench::RingBenchOptions>();
  CLI::App* ring = cmd->add_subcommand(
      "ring-attention", "Ring attention (context parallelism): serial vs overlapped, one vs two communicators");
  ring->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // scripts append overrides
  ring->add_option("--context-parallel-size,--cp", rg->cp, "CP (default: the world)");
  ring->add_option("--seq-length", rg->seq, "Sequence length S (divisible by 2·CP)")->capture_default_str();
  ring->add_option("--num-attention-heads", rg->heads, "Heads")->capture_default_str();
  ring->add_option("--kv-channels", rg->head_dim, "Head dimension D")->capture_default_str();
  ring->add_option("--micro-batch-size", rg->batch, "Sequences")->capture_default_str();
  ring->add_option("--attention-mask-type", rg->mask, "causal or general")
      ->check(CLI::IsMember({"causal", "general"}))
      ->capture_default_str();
  ring->add_option("--cp-window-size", rg->window_size, "Double-ring window (divides CP)")->capture_default_str();
  ring->add_option("--comm-engine", rg->engine,
                   "Progress engine: 'inline' (MPI progresses when the ring polls between blocks) or 'thread' (a "
                   "progress thread)")
      ->check(CLI::IsMember({"inline", "thread"}))
      ->capture_default_str();
  ring->add_option("--comm-poll-us", rg->poll_us, "Thread engine: microseconds between polls")->capture_default_str();
  ring->add_option("--reps", rg->reps, "Timed repetitions")->capture_default_str();
  ring->add_option("--warmup", rg->warmup, "Untimed repetitions first")->capture_default_str();
  ring->add_option("--json", rg->json, "Write the results and the environment to this JSON file");
  auto tr = std::make_shared<bench::TrainBenchOptions>();
  CLI::App* t = bench::add_train_bench(cmd, *tr);
  auto verbose = std::make_shared<int>(0);
  o->add_flag("-v,--verbose", *verbose, "Log each CoC op's schedule (rank 0)");
  return [ov, cm, wq, gm, tr, rg, o, q, gq, t, ring, verbose] {
    if (q->parsed()) return bench::run_w8a16(*wq);
    if (gq->parsed()) return bench::run_gemm(*gm);
    if (ring->parsed()) return bench::run_ring_bench(*rg);
    if (t->parsed()) return bench::run_train_bench(t, *tr);
    if (o->parsed()) {
      if (*verbose > 0) log::set_level(2);
      return bench::run_overlap(*ov);
    }
    return bench::run_comm(*cm);
  };
}

}  // namespace coc::cli
