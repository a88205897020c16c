#!/usr/bin/env bash
# coc-test-timeout: 900
# MoE in `coc train` (issue 19): the tiny-moe model's losses are bitwise equal with every --ep-dispatcher in
# deterministic mode, and equal to rounding across (tp, dp, ep) layouts on 4 ranks (coc check --train-steps 20:
# each run against the eager dispatcher at N = 1 and against tp 1 × ep 1); a MoE checkpoint with ep 2 resumes
# exactly; bad MoE input through coc train gets one clear line and a non-zero exit.
source "$(dirname "$0")/common.bash"
# A small MoE model so that 20 steps of 3 runs fit the test's time on 2 cores.
M=(--config "$ROOT/configs/moe.yaml" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
   --moe-ffn-hidden-size 64 --seq-length 32 --micro-batch-size 2)
train_check() {  # train_check RANKS ARGS...: coc check --train-steps 20, prints its table
  timeout 600 "$LAUNCH" -n "$1" -- "$COC" check "${M[@]}" --train-steps 20 --tp-rtol 1e-5 "${@:2}" >"$TMP/out" 2>&1
  local rc=$?; tail -4 "$TMP/out"; return $rc
}
for d in eager fused mc2; do
  check "ep 2 --ep-dispatcher $d: bitwise equal to eager N=1, within 1e-5 of ep 1" \
    train_check 2 --deterministic --expert-model-parallel-size 2 --ep-dispatcher "$d"
done
check "mc2, not deterministic: within 1e-5 of eager and of ep 1" train_check 2 --ep-dispatcher mc2 --rtol 1e-5
check "4 ranks, ep 2 x dp 2, mc2 3 chunks" \
  train_check 4 --deterministic --expert-model-parallel-size 2 --ep-dispatcher mc2 --moe-mc2-chunks 3
check "4 ranks, ep 4, fused" train_check 4 --deterministic --expert-model-parallel-size 4 --ep-dispatcher fused
check "4 ranks, ep 1 x dp 4" train_check 4 --deterministic --expert-model-parallel-size 1
# tp changes the attention's rounding, and a learned router turns a rounding difference at a near tie into another
# expert (a loss step of ~1e-5..1e-3); the fixed router keeps the routing, so tp 2 must then match to rounding.
check "4 ranks, tp 2 x ep 2 (MoE replicated over tp), fixed router" \
  train_check 4 --deterministic --tp 2 --expert-model-parallel-size 2 --ep-dispatcher mc2 --moe-fixed-router balanced

# Checkpoints: ep 2 writes one shard per ep rank, and resuming gives the straight run's losses.
C=("${M[@]}" --deterministic --lr-warmup-iters 1 --lr-decay-iters 4 --sample-length 0 --no-progress -v)
losses() { grep -o "\[rank 0\] iteration [0-9]*:.*loss [-0-9.e]*" "$1" | sed 's/.*iteration \([0-9]*\):.*loss /\1 /'; }
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 4 >"$TMP/straight" 2>&1
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 2 --save "$TMP/ck" >"$TMP/first" 2>&1
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 4 --load "$TMP/ck" >"$TMP/resumed" 2>&1
check "a shard per ep rank" bash -c "ls '$TMP/ck/iter_0000002/' | grep -q mp_rank_00_dp_001"
check "load_balancing_loss logged" grep -q "load_balancing_loss" "$TMP/straight"
losses "$TMP/straight"; echo "resumed:"; losses "$TMP/resumed"
check "iterations 3-4 bitwise identical after resume" \
  bash -c "diff <(grep -E '^(3|4) ' <(echo \"\$1\")) <(echo \"\$2\")" _ "$(losses "$TMP/straight")" "$(losses "$TMP/resumed")"
expect_error moe_resume_other_ep "saved with --expert-model-parallel-size 2 but this run has 1" 2 -- \
  train "${C[@]}" --train-iters 4 --load "$TMP/ck" --expert-model-parallel-size 1

# coc bench train switches the dispatcher between iterations: eager on the even ones, mc2 on the odd ones (-vv logs
# every collective: mc2's exchanges are tagged by chunk), with the straight run's losses (deterministic).
timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train "${C[@]}" --train-iters 4 --skip-pairs 0 --ep-dispatcher mc2 \
  --baseline "--ep-dispatcher eager" -vv >"$TMP/bench" 2>&1
check "bench train --baseline \"--ep-dispatcher eager\": both dispatchers ran" \
  bash -c "grep -q ': moe dispatch forward\$' '$TMP/bench' && grep -q ': moe dispatch forward chunk' '$TMP/bench'"
check "bench train: the straight run's losses" \
  bash -c "diff <(echo \"\$1\") <(echo \"\$2\")" _ "$(losses "$TMP/straight")" "$(losses "$TMP/bench")"

# Bad input.
expect_error moe_train_experts_not_divisible "num-experts 6 is not divisible by --expert-model-parallel-size 4" 4 -- \
  train "${M[@]}" --num-experts 6 --expert-model-parallel-size 4
expect_error moe_train_topk_above_experts "moe-router-topk 5 must be in \[1, --num-experts 4\]" 2 -- \
  train "${M[@]}" --moe-router-topk 5
expect_error moe_train_ep_not_fitting "expert-model-parallel-size 4" 2 -- train "${M[@]}" --expert-model-parallel-size 4
expect_error moe_train_capacity_zero "moe-expert-capacity-factor 0 must be > 0" 2 -- \
  train "${M[@]}" --moe-expert-capacity-factor 0
expect_error moe_train_capacity_negative "moe-expert-capacity-factor -0.5 must be > 0" 2 -- \
  train "${M[@]}" --moe-expert-capacity-factor -0.5
expect_error moe_train_sp_tp "sequence-parallel and --tensor-model-parallel-size 2 is not supported" 2 -- \
  train "${M[@]}" --tp 2 --sequence-parallel --expert-model-parallel-size 1
expect_error moe_train_ep_without_experts "expert-model-parallel-size 2 needs a MoE model" 2 -- \
  train --expert-model-parallel-size 2
expect_error moe_train_unknown_dispatcher "ep-dispatcher alltoall: unknown dispatcher" 2 -- \
  train "${M[@]}" --ep-dispatcher alltoall
finish
