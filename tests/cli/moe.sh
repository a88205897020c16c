#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc check --layer moe` (issue 19): the MoE layer with each dispatcher, EP size and router pattern against the
# fp64 single-rank reference, and its bad input (one clear line, exit 2, no hang).
source "$(dirname "$0")/common.bash"
run() { timeout 300 "$LAUNCH" -n "$1" -- "$COC" check --layer moe --m 120 --k 32 --n 48 "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "moe eager ep 1" run 1 --ep-dispatcher eager
default_is_mc2() { run 2 --ep 2 && grep -q "dispatcher mc2 (2 chunks)" "$TMP/out"; }
check "moe ep 2, no --ep-dispatcher: mc2, coc's default" default_is_mc2
check "moe mc2 ep 2, skewed router, top-1" run 2 --ep 2 --ep-dispatcher mc2 --moe-router-topk 1 --moe-fixed-router skewed
check "moe fused ep 2 x dp 2, empty experts, --debug-collectives" \
  run 4 --ep 2 --ep-dispatcher fused --moe-fixed-router empty --debug-collectives
check "moe mc2 ep 4, 8 experts, 3 chunks, capacity 1.0, deterministic" \
  run 4 --ep 4 --num-experts 8 --ep-dispatcher mc2 --moe-mc2-chunks 3 --moe-expert-capacity-factor 1.0 --deterministic
check "moe eager ep 1 x dp 4, balanced" run 4 --ep-dispatcher eager --moe-fixed-router balanced
expect_error moe_experts_not_divisible "num-experts 6 is not divisible by --expert-model-parallel-size 4" 4 -- \
  check --layer moe --num-experts 6 --ep 4
expect_error moe_topk_above_experts "moe-router-topk 5 must be in \[1, --num-experts 4\]" 2 -- \
  check --layer moe --moe-router-topk 5
expect_error moe_ep_not_fitting "expert-model-parallel-size 4 does not divide" 2 -- check --layer moe --ep 4
expect_error moe_capacity_zero "moe-expert-capacity-factor 0 must be > 0" 2 -- \
  check --layer moe --moe-expert-capacity-factor 0
expect_error moe_capacity_negative "moe-expert-capacity-factor -1 must be > 0" 2 -- \
  check --layer moe --moe-expert-capacity-factor -1
expect_error moe_unknown_dispatcher "ep-dispatcher alltoall: unknown dispatcher" 2 -- \
  check --layer moe --ep-dispatcher alltoall
expect_error moe_flag_without_moe_layer "--num-experts applies to --layer moe and --train-steps only" 2 -- check --op matmul_all_reduce --num-experts 8
expect_error moe_with_tp "without tensor parallelism" 2 -- check --layer moe --tp 2
finish
