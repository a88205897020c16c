#!/usr/bin/env bash
# coc-test-timeout: 900
# Sharded data parallelism (issue 17; docs/semantics.md §4): `coc check --train-steps` with every strategy against
# no_shard (bitwise with --deterministic, also against F = B = 0 and with randomly delayed gathers) at dp 4,
# tp 2 × dp 2 with SP, dp 3 with gradient accumulation; the memory line; checkpoints across strategies; and each bad
# setting is one clear line with exit 2.
source "$(dirname "$0")/common.bash"
trainsteps() { timeout 300 "$LAUNCH" -n "$1" -- "$COC" check --train-steps "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "dp 4, optim_grads_params (F=B=1), 20 steps, bitwise no_shard and F=B=0" \
  trainsteps 4 20 --tp 1 --deterministic --data-parallel-sharding-strategy optim_grads_params
check "... the comparisons ran" bash -c "grep -q 'optim_grads_params vs no_shard: max relative loss difference 0.000e+00' '$TMP/out' && grep -q 'prefetch F=1 B=1 vs F=B=0: max relative loss difference 0.000e+00' '$TMP/out'"
check "tp 2 x dp 2 with SP, optim, 20 steps, bitwise" \
  trainsteps 4 20 --tp 2 --sequence-parallel --deterministic --data-parallel-sharding-strategy optim
check "tp 2 x dp 2 with SP, optim_grads_params F=B=2, 5 steps, bitwise" \
  trainsteps 4 5 --tp 2 --sequence-parallel --deterministic --data-parallel-sharding-strategy optim_grads_params \
  --num-to-forward-prefetch 2 --num-to-backward-prefetch 2
check "dp 3 (uneven shards), optim_grads, 4 micro-batches per rank, bitwise" \
  trainsteps 3 5 --tp 1 --deterministic --data-parallel-sharding-strategy optim_grads --micro-batch-size 2 \
  --global-batch-size 24
check "dp 4, optim_grads_params without --deterministic, within 1e-5" \
  trainsteps 4 5 --tp 1 --data-parallel-sharding-strategy optim_grads_params
COC_TEST_FSDP_DELAY_SEED=7 check "randomly delayed gathers, F=3 B=2 against F=B=0 and no_shard, bitwise" \
  trainsteps 4 5 --tp 1 --deterministic --data-parallel-sharding-strategy optim_grads_params \
  --num-to-forward-prefetch 3 --num-to-backward-prefetch 2

# The memory line: optim_grads_params' parameters + gradients + optimizer are 1/4 of no_shard's at dp 4 (the tiny
# model's sizes divide by 4), and the gathered window grows with F.
C=(--tp 1 --train-iters 1 --sample-length 0 --no-progress --seq-length 64)
mem() { timeout 120 "$LAUNCH" -n 4 -- "$COC" train "${C[@]}" "$@" -v 2>&1 | grep -m1 "memory per rank"; }
mem > "$TMP/mem_ns"
mem --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 0 --num-to-backward-prefetch 0 \
  > "$TMP/mem_f0"
mem --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 2 --num-to-backward-prefetch 2 \
  > "$TMP/mem_f2"
cat "$TMP/mem_ns" "$TMP/mem_f0" "$TMP/mem_f2"
sum() { grep -o "parameters [0-9.]* MiB, gradients [0-9.]* MiB, optimizer [0-9.]*" "$1" | awk '{print $2 + $5 + $8}'; }
win() { grep -o "gathered window [0-9.]*" "$1" | awk '{print $3}'; }
check "memory line on every rank's first iteration" grep -q "memory per rank: parameters .* peak RSS" "$TMP/mem_f0"
check "optim_grads_params P+G+O <= no_shard's / 4 (+1%)" \
  awk -v s="$(sum "$TMP/mem_f0")" -v n="$(sum "$TMP/mem_ns")" 'BEGIN { exit !(s > 0 && s <= n / 4 * 1.01) }'
check "the gathered window grows with F" \
  awk -v a="$(win "$TMP/mem_f0")" -v b="$(win "$TMP/mem_f2")" 'BEGIN { exit !(a > 0 && b > a) }'
# The layout line says what is sharded, and that nothing is when there is one replica (tp 2 on 2 ranks).
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 1 --sample-length 0 --no-progress --seq-length 64 \
  --data-parallel-sharding-strategy optim_grads_params > "$TMP/one_replica" 2>&1
check "one replica: the sharding line says nothing is sharded" \
  grep -q "sharding: optim_grads_params over dp × cp = 1, .*nothing to shard" "$TMP/one_replica"
check "dp 4: the sharding line names the strategy and prefetch" \
  bash -c "timeout 120 '$LAUNCH' -n 4 -- '$COC' train ${C[*]} --data-parallel-sharding-strategy optim_grads_params 2>&1 |
    grep -q 'sharding: optim_grads_params over dp × cp = 4, --num-to-forward-prefetch 1, --num-to-backward-prefetch 1$'"

# Checkpoints are strategy-independent: 2 iterations sharded, saved, resumed with no_shard (and the other way) to 4
# give the losses of 4 straight iterations.
C=(--tp 1 --deterministic --lr-warmup-iters 1 --lr-decay-iters 4 --sample-length 0 --no-progress --seq-length 64)
losses() { grep -o "iteration *[0-9]*/ *[0-9]* | loss [0-9.]*" "$1" | sed 's/ \+/ /g'; }
tr4() { timeout 120 "$LAUNCH" -n 4 -- "$COC" train "${C[@]}" "$@" 2>"$TMP/err"; }
tr4 --train-iters 4 >"$TMP/straight"
tr4 --train-iters 2 --save "$TMP/ck1" --data-parallel-sharding-strategy optim_grads_params >/dev/null
tr4 --train-iters 4 --load "$TMP/ck1" >"$TMP/resumed1"
tr4 --train-iters 2 --save "$TMP/ck2" >/dev/null
tr4 --train-iters 4 --load "$TMP/ck2" --data-parallel-sharding-strategy optim >"$TMP/resumed2"
losses "$TMP/straight"; losses "$TMP/resumed1"; losses "$TMP/resumed2"
check "optim_grads_params checkpoint resumes with no_shard" diff <(losses "$TMP/straight" | tail -2) <(losses "$TMP/resumed1")
check "no_shard checkpoint resumes with optim" diff <(losses "$TMP/straight" | tail -2) <(losses "$TMP/resumed2")
# --no-load-optim: the shards take the loaded weights (only the moments are dropped), as no_shard's parameters do.
tr4 --train-iters 4 --load "$TMP/ck1" --no-load-optim >"$TMP/fresh_ns"
tr4 --train-iters 4 --load "$TMP/ck1" --no-load-optim --data-parallel-sharding-strategy optim_grads_params \
  >"$TMP/fresh_z3"
check "--no-load-optim with optim_grads_params: no_shard's losses" \
  bash -c "test -n \"\$1\" && test \"\$1\" = \"\$2\"" _ "$(losses "$TMP/fresh_ns")" "$(losses "$TMP/fresh_z3")"

# --overlap-grad-reduce (no_shard) against the blocking reduction, with tp 2, SP and accumulation.
check "--overlap-grad-reduce, tp 2 x dp 2, SP, 2 micro-batches, bitwise the blocking reduction" \
  trainsteps 4 5 --tp 2 --sequence-parallel --deterministic --overlap-grad-reduce --micro-batch-size 2 \
  --global-batch-size 8
check "... compared" grep -q "no_shard with --overlap-grad-reduce vs no_shard: max relative loss difference 0.000e+00" "$TMP/out"

# Prefetch depths and --overlap-grad-reduce switch between iterations (coc bench train --baseline); the strategy not.
bt() { timeout 200 "$LAUNCH" -n 2 -- "$COC" bench train --tp 1 --seq-length 64 --train-iters 4 --skip-pairs 0 \
  --deterministic "$@" >"$TMP/bt" 2>&1; local rc=$?; tail -n 4 "$TMP/bt"; return $rc; }
check "bench train: F=B=2 against --baseline F=B=0" bt --data-parallel-sharding-strategy optim_grads_params \
  --num-to-forward-prefetch 2 --num-to-backward-prefetch 2 \
  --baseline "--num-to-forward-prefetch 0 --num-to-backward-prefetch 0"
check "bench train: --overlap-grad-reduce against --baseline without" bt --overlap-grad-reduce --coc-parallel-num 1 \
  --baseline "--no-overlap-grad-reduce"
expect_error bench_strategy_not_switchable "--data-parallel-sharding-strategy cannot change between iterations \(the shards" 2 -- \
  bench train --baseline "--data-parallel-sharding-strategy optim"

# The profile: FSDP collectives on their own track, the gathered-bytes counter, and coc analyze reads the trace.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --tp 1 --train-iters 2 --sample-length 0 --no-progress --seq-length 64 \
  --data-parallel-sharding-strategy optim_grads_params --profile --profile-dir "$TMP/prof" >/dev/null 2>&1
trace=$(ls "$TMP"/prof/*.json 2>/dev/null | head -1)
check "profile: a 'comm fsdp' track" grep -q '"name":"thread_name".*"comm fsdp"' "$trace"
check "profile: the 'fsdp gathered bytes' counter" grep -q '"ph":"C","name":"fsdp gathered bytes"' "$trace"
check "profile: coc analyze counts the FSDP collectives" bash -c "'$COC' analyze '$trace' | grep -q 'communication all_gather'"

expect_error bad_strategy "--data-parallel-sharding-strategy 'zero3' is not one of no_shard, optim, optim_grads, optim_grads_params" 2 -- \
  train --data-parallel-sharding-strategy zero3 --train-iters 1
check "exit 2 for a bad strategy" test "$last_rc" -eq 2
expect_error negative_forward_prefetch "--num-to-forward-prefetch must be >= 0" 2 -- \
  train --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch -1 --train-iters 1
expect_error negative_backward_prefetch "--num-to-backward-prefetch must be >= 0" 2 -- \
  check --train-steps 2 --data-parallel-sharding-strategy optim_grads_params --num-to-backward-prefetch -3
finish
