#!/usr/bin/env bash
# coc-test-timeout: 300
# Edge cases 11 and 12 of docs/edge-cases.md: no silent non-overlap. With -v every tensor-parallel layer says which path
# it took and why, a run with N = 1 says it is the plain order, small chunks fall back with a reason, and each rank
# prints its GEMM and communication-wait time.
source "$(dirname "$0")/common.bash"
run() { timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 1 --sample-length 0 --no-progress -v "$@" 2>&1; }
run >"$TMP/n4"
for layer in attention.qkv attention.dense mlp.gate_up mlp.down; do
  check "N=4: layers.0.$layer forward path named" grep -Eq "'layers.0.$layer fwd'.*(compute-first|communicate-first)" "$TMP/n4"
  check "N=4: layers.0.$layer backward path named" grep -Eq "'layers.0.$layer bwd dX'.*(compute-first|communicate-first)" "$TMP/n4"
done
check "N=4: column forward is communicate-first (AG->GEMM)" grep -Eq "all_gather_matmul_v2 'layers.0.attention.qkv fwd'.*communicate-first" "$TMP/n4"
check "N=4: row forward is compute-first (GEMM->RS)" grep -Eq "matmul_reduce_scatter 'layers.0.mlp.down fwd'.*compute-first" "$TMP/n4"
check "per-rank GEMM and communication-wait time (rank 0)" grep -Eq "\[rank 0\] iteration 1: GEMM [0-9.]+ ms, waiting for communication [0-9.]+ ms" "$TMP/n4"
check "per-rank GEMM and communication-wait time (rank 1)" grep -Eq "\[rank 1\] iteration 1: GEMM [0-9.]+ ms, waiting for communication" "$TMP/n4"
run --coc-parallel-num 1 >"$TMP/n1"
check "N=1: plain Megatron order, said so" grep -q "N=1: plain Megatron order, no overlap" "$TMP/n1"
run --coc-parallel-num 8 --coc-min-chunk-rows 400 --no-sequence-parallel >"$TMP/fallback"
check "small chunks: N lowered to 1, with the reason" grep -Eq "min_chunk_rows=400: N lowered 8->1" "$TMP/fallback"
check "serial fallbacks counted" grep -Eq "[1-9][0-9]* serial fallbacks" "$TMP/fallback"
finish
