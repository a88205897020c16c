#!/usr/bin/env bash
# coc-test-timeout: 600
# Activation recomputation (issue 33; model/transformer_layer.h): coc train with --recompute-granularity full (uniform
# and block) and selective gives, under --deterministic, the losses of the run without it, bit for bit, on the default
# job (tp 2 with SP), ZeRO-3 with backward prefetch, context parallelism (ring attention) and a MoE model; the memory
# line reports fewer activation bytes; bench train --baseline alternates it; each bad combination is one clear line.
source "$(dirname "$0")/common.bash"
C=(--train-iters 3 --deterministic -v --no-progress --sample-length 0)
losses() { timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" "$@" 2>&1 | tee "$TMP/last" |
  sed -n 's/^\[rank 0\] iteration \([0-9]*\): .*loss \([0-9.]*\)$/\1 \2/p'; }
FULL2=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 2)
BLOCK1=(--recompute-granularity full --recompute-method block --recompute-num-layers 1)
SEL=(--recompute-granularity selective)
same() {  # same NAME BASE_FLAGS... -- RECOMPUTE_FLAGS...
  local name="$1"; shift
  local base=() rec=()
  while [ "$1" != -- ]; do base+=("$1"); shift; done; shift; rec=("$@")
  losses "${base[@]}" > "$TMP/a"
  losses "${base[@]}" "${rec[@]}" > "$TMP/b"
  check "$name: $(wc -l < "$TMP/a") losses bitwise equal" bash -c "[ -s '$TMP/a' ] && cmp -s '$TMP/a' '$TMP/b'"
}
same "default job, full uniform 2" -- "${FULL2[@]}"
same "default job, full block 1" -- "${BLOCK1[@]}"
same "default job, selective" -- "${SEL[@]}"
same "ZeRO-3 with backward prefetch 2, full uniform 2" --tensor-model-parallel-size 1 \
  --data-parallel-sharding-strategy optim_grads_params --num-to-backward-prefetch 2 -- "${FULL2[@]}"
same "context parallelism 2 (ring), full uniform 2" --tensor-model-parallel-size 1 --context-parallel-size 2 -- \
  "${FULL2[@]}"
same "MoE (ep 2), full block 1" --config "$ROOT/configs/moe.yaml" -- "${BLOCK1[@]}"

act() { grep -m1 -o "activations [0-9.]* MiB" "$1" | awk '{print $2}'; }
losses > /dev/null; cp "$TMP/last" "$TMP/none"
losses --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 > /dev/null
cp "$TMP/last" "$TMP/full"
check "memory line: full recomputation keeps fewer activation bytes ($(act "$TMP/full") vs $(act "$TMP/none") MiB)" \
  awk -v f="$(act "$TMP/full")" -v n="$(act "$TMP/none")" 'BEGIN { exit !(f > 0 && f < n / 2) }'

timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train --train-iters 6 --sample-length 0 --baseline \
  "--recompute-granularity none" --recompute-granularity full --recompute-method block --recompute-num-layers 1 \
  > "$TMP/bench" 2>&1
check "bench train --baseline alternates the recomputation" grep -q "median" "$TMP/bench"
side_act() { grep -m1 -o "memory per rank ($1): .*activations [0-9.]* MiB" "$TMP/bench" | awk '{print $(NF-1)}'; }
check "each side prints its memory line: run $(side_act run) < baseline $(side_act baseline) MiB" \
  awk -v r="$(side_act run)" -v b="$(side_act baseline)" 'BEGIN { exit !(r > 0 && r < b) }'

timeout 300 "$LAUNCH" -n 2 -- "$COC" check --train-steps 3 --deterministic "${FULL2[@]}" > "$TMP/check" 2>&1
check "coc check --train-steps compares recomputation with keeping activations (exit $?)" \
  grep -q "recomputation vs keeping activations: max relative loss difference 0.000e+00 .* ok" "$TMP/check"

expect_error full_without_method "needs --recompute-method" 1 -- train --recompute-granularity full
expect_error num_layers_out_of_range "--recompute-num-layers 9 .*from 1 to --num-layers \(3\)" 1 -- train \
  --recompute-granularity full --recompute-method block --recompute-num-layers 9
expect_error selective_with_num_layers "drop --recompute-num-layers" 1 -- train --recompute-granularity selective \
  --recompute-num-layers 1
expect_error method_without_granularity "without --recompute-granularity: add --recompute-granularity full" 1 -- \
  train --recompute-method uniform --recompute-num-layers 1
expect_error selective_with_method "drop --recompute-method" 1 -- train --recompute-granularity selective \
  --recompute-method block
expect_error activations_against_full "--recompute-activations means --recompute-granularity selective.*contradicts" \
  1 -- train --recompute-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
expect_error bad_granularity "--recompute-granularity 'partial'" 1 -- train --recompute-granularity partial
finish
