#!/usr/bin/env bash
# coc-test-timeout: 900
# MoE with sharded data parallelism (issue 32; docs/semantics.md §4): the experts shard over their expert-dp ranks,
# the dense weights over dp × cp. `coc check --train-steps` runs every strategy against no_shard (losses and
# gradient norms bitwise with --deterministic, clipping active: the norms are above --clip-grad 1) on ep 2 × dp 4
# (expert-dp 2, smaller than the dense replicas), ep 4 (expert-dp 1), ep 1 × dp 3 (uneven expert shards), 3 experts
# over ep 3, tp 2 × ep 2 and cp 2 × ep 2; --overlap-grad-reduce for MoE; the memory line counts the expert shards;
# sharded MoE checkpoints resume bit for bit with any strategy, also with --no-load-optim.
source "$(dirname "$0")/common.bash"
# A small MoE model (configs/moe.yaml: 4 experts top-2, ep 2, the mc2 dispatcher) so that the runs fit 2 cores;
# the global batch (auto: 16) gives each rank several micro-batches to accumulate.
M=(--config "$ROOT/configs/moe.yaml" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
   --moe-ffn-hidden-size 64 --seq-length 32 --micro-batch-size 2)
train_check() {  # train_check RANKS ARGS...: coc check --train-steps 8, prints its verdict lines
  timeout 600 "$LAUNCH" -n "$1" -- "$COC" check "${M[@]}" --train-steps 8 --tp-rtol 1e-5 "${@:2}" >"$TMP/out" 2>&1
  local rc=$?; grep -E "vs no_shard|PASSED|FAIL|error" "$TMP/out"; return $rc
}
bitwise() {  # bitwise STRATEGY: both comparisons against no_shard ran and were exact
  grep -q "$1 vs no_shard: max relative loss difference 0.000e+00" "$TMP/out" &&
    grep -q "$1 vs no_shard: max relative gradient norm difference 0.000e+00" "$TMP/out"
}
for s in optim optim_grads optim_grads_params; do
  check "4 ranks, ep 2 x expert-dp 2 (dense dp 4), $s: bitwise no_shard" \
    train_check 4 --deterministic --expert-model-parallel-size 2 --data-parallel-sharding-strategy "$s"
  check "... losses and gradient norms compared" bitwise "$s"
done
check "4 ranks, ep 4 (expert-dp 1), optim_grads_params F=B=2, eager" \
  train_check 4 --deterministic --expert-model-parallel-size 4 --ep-dispatcher eager \
  --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 2 --num-to-backward-prefetch 2
check "... compared" bitwise optim_grads_params
check "3 ranks, ep 1 x dp 3 (uneven expert shards), optim_grads" \
  train_check 3 --deterministic --expert-model-parallel-size 1 --data-parallel-sharding-strategy optim_grads
check "... compared" bitwise optim_grads
check "3 ranks, 3 experts over ep 3, optim" \
  train_check 3 --deterministic --num-experts 3 --expert-model-parallel-size 3 --data-parallel-sharding-strategy optim
check "... compared" bitwise optim
# A learned router turns the tp or cp rounding at a near tie into another expert; the fixed router keeps the
# routing, so the layout comparisons hold to rounding (moe_train.sh says more).
check "4 ranks, tp 2 x ep 2 (experts replicated over tp), optim_grads_params, fixed router" \
  train_check 4 --deterministic --tp 2 --expert-model-parallel-size 2 --moe-fixed-router balanced \
  --data-parallel-sharding-strategy optim_grads_params
check "... compared" bitwise optim_grads_params
check "4 ranks, cp 2 x ep 2 (expert-dp 1, dense dp x cp 4), optim_grads, fixed router" \
  train_check 4 --deterministic --context-parallel-size 2 --expert-model-parallel-size 2 \
  --moe-fixed-router balanced --data-parallel-sharding-strategy optim_grads
check "... compared" bitwise optim_grads
check "4 ranks, ep 2, --overlap-grad-reduce (no_shard): bitwise the reduction after the backward" \
  train_check 4 --deterministic --expert-model-parallel-size 2 --overlap-grad-reduce
check "... compared" bitwise "no_shard with --overlap-grad-reduce"
check "4 ranks, ep 2, optim_grads_params without --deterministic: within 1e-5" \
  train_check 4 --expert-model-parallel-size 2 --data-parallel-sharding-strategy optim_grads_params --rtol 1e-5

# The memory line: every rank holds 1/dp of the experts' state whatever ep (ep × expert-dp = dp), so
# optim_grads_params' parameters + gradients + optimizer at ep 2 are no_shard's at ep 1 / 4 (up to the padding and
# the line's rounding); no_shard at ep 2 holds half the experts.
B=(--config "$ROOT/configs/moe.yaml" --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 512
   --moe-ffn-hidden-size 512 --seq-length 32 --micro-batch-size 1 --train-iters 1 --sample-length 0 --no-progress)
mem() {  # mem ARGS: the first memory line of a 4-rank run (the whole log stays in $TMP/mem_run)
  timeout 120 "$LAUNCH" -n 4 -- "$COC" train "${B[@]}" "$@" >"$TMP/mem_run" 2>&1
  grep -m1 "memory per rank" "$TMP/mem_run"
}
sum() { grep -o "parameters [0-9.]* MiB, gradients [0-9.]* MiB, optimizer [0-9.]*" "$1" | awk '{print $2 + $5 + $8}'; }
mem --expert-model-parallel-size 1 >"$TMP/mem_ns1"
mem --expert-model-parallel-size 2 >"$TMP/mem_ns2"
mem --expert-model-parallel-size 2 --data-parallel-sharding-strategy optim_grads_params >"$TMP/mem_z3"
cat "$TMP/mem_ns1" "$TMP/mem_ns2" "$TMP/mem_z3"
check "the sharding line names the experts' group" grep -q \
  "sharding: optim_grads_params over dp × cp = 4, the experts over expert-dp = 2, --num-to-forward" "$TMP/mem_run"
check "ep 2, optim_grads_params: P+G+O = no_shard ep 1's / 4 (within 2%)" \
  awk -v s="$(sum "$TMP/mem_z3")" -v n="$(sum "$TMP/mem_ns1")" \
  'BEGIN { exit !(s > 0 && s >= n / 4 * 0.98 && s <= n / 4 * 1.02) }'
check "no_shard ep 2 holds less than ep 1 (half the experts)" \
  awk -v a="$(sum "$TMP/mem_ns2")" -v b="$(sum "$TMP/mem_ns1")" 'BEGIN { exit !(a > 0 && a < b) }'

# Checkpoints: the sharded run gathers its experts over expert-dp and its dense weights over dp × cp before the
# writers (one per ep rank) write; any strategy resumes from them, and resuming gives the straight run's losses
# (every digit: -v). --no-load-optim restarts the optimizer: sharded or not, the same losses.
C=("${M[@]}" --expert-model-parallel-size 2 --deterministic --lr-warmup-iters 1 --lr-decay-iters 4 --sample-length 0
   --no-progress -v)
losses() { grep -o "\[rank 0\] iteration [0-9]*:.*loss [-0-9.e]*" "$1" | sed 's/.*iteration \([0-9]*\):.*loss /\1 /'; }
tr4() { timeout 300 "$LAUNCH" -n 4 -- "$COC" train "${C[@]}" "$@" 2>&1; }
tr4 --train-iters 4 >"$TMP/straight"
tr4 --train-iters 2 --save "$TMP/ck" --data-parallel-sharding-strategy optim_grads_params >"$TMP/first"
check "a shard per ep rank" bash -c "ls '$TMP/ck/iter_0000002/' | grep -q mp_rank_00_dp_001"
for s in optim_grads_params optim no_shard; do
  tr4 --train-iters 4 --load "$TMP/ck" --data-parallel-sharding-strategy "$s" >"$TMP/resumed_$s"
  check "optim_grads_params checkpoint resumed with $s: iterations 3-4 bitwise the straight run's" \
    diff <(losses "$TMP/straight" | grep -E '^(3|4) ') <(losses "$TMP/resumed_$s")
done
tr4 --train-iters 2 --save "$TMP/ck_ns" >/dev/null
tr4 --train-iters 4 --load "$TMP/ck_ns" --data-parallel-sharding-strategy optim_grads >"$TMP/resumed_ns"
check "no_shard checkpoint resumed with optim_grads: bitwise" \
  diff <(losses "$TMP/straight" | grep -E '^(3|4) ') <(losses "$TMP/resumed_ns")
tr4 --train-iters 4 --load "$TMP/ck" --no-load-optim >"$TMP/fresh_ns"
for s in optim optim_grads_params; do
  tr4 --train-iters 4 --load "$TMP/ck" --no-load-optim --data-parallel-sharding-strategy "$s" >"$TMP/fresh_$s"
  check "--no-load-optim with $s: the loaded weights, no_shard's losses" \
    bash -c "test -n \"\$1\" && test \"\$1\" = \"\$2\"" _ "$(losses "$TMP/fresh_ns")" "$(losses "$TMP/fresh_$s")"
done
losses "$TMP/straight"; echo "no_shard --no-load-optim:"; losses "$TMP/fresh_ns"
finish
