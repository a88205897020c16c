#!/usr/bin/env bash
# coc-test-timeout: 600
# --overlap-forward-micro-batches (docs/semantics.md §2): two micro-batches' forwards interleaved layer by layer, then
# each one's loss and backward in order. `coc check --train-steps --deterministic` compares the run against the
# sequential plain order (N = 1, every overlap off): tolerance 0, the interleaving must not change a bit. Four
# micro-batches per iteration at tp 2, three at tp 3 (the last one runs alone), over sequences of 130 positions (two
# attention blocks, the second partial); sequence parallelism on and off. Then `coc bench train --baseline`
# alternates it with the sequential forwards in one run, the help text, and the combinations it refuses.
source "$(dirname "$0")/common.bash"

PASSES_TIMEOUT=240
bitwise() {
  check "$1: 0 difference to the plain order" grep -q "vs N=1: *max relative loss difference 0.000e+00" "$TMP/$1.out"
}

pair=(--overlap-forward-micro-batches --micro-batch-size 2 --global-batch-size 8 --seq-length 130 --hidden-size 96
      --num-attention-heads 6 --ffn-hidden-size 198)
for sp in "" "--sequence-parallel"; do
  for n in 1 auto; do
    name="train_tp2_pair_n${n}${sp:+_sp}"
    # shellcheck disable=SC2086
    passes_check "$name" 2 -- check --train-steps 3 --deterministic --coc-parallel-num "$n" $sp "${pair[@]}"
    bitwise "$name"
  done
done
passes_check train_tp3_pair_sp_bf16 3 -- check --train-steps 2 --deterministic --tp 3 --sequence-parallel \
  --coc-parallel-num 3 --bf16 "${pair[@]}" --global-batch-size 6
bitwise train_tp3_pair_sp_bf16

# Alternating with the sequential forwards in one run: under --deterministic the curve is a plain run's.
lr=(--lr 1e-3 --min-lr 1e-4)  # bench train's learning rates
timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train --train-iters 6 --skip-pairs 1 --deterministic --sequence-parallel \
  "${lr[@]}" "${pair[@]}" --baseline "--no-overlap-forward-micro-batches" >"$TMP/ab.out" 2>&1
check "bench train --baseline --no-overlap-forward-micro-batches runs" grep -q "coc bench train:" "$TMP/ab.out"
grep -o "loss [0-9.]*" "$TMP/ab.out" | head -6 >"$TMP/ab.losses"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train --train-iters 6 --sample-length 0 --deterministic --sequence-parallel \
  "${lr[@]}" "${pair[@]:1}" 2>&1 | grep -o "loss [0-9.]*" | head -6 >"$TMP/plain.losses"
check "bench train: deterministic losses equal a plain coc train's" bash -c \
  "[ \$(wc -l <'$TMP/ab.losses') = 6 ] && cmp '$TMP/ab.losses' '$TMP/plain.losses'"

check "train --help lists --overlap-forward-micro-batches" bash -c \
  "'$COC' train --help 2>&1 | grep -q -- '--overlap-forward-micro-batches'"
T=(--train-iters 2 --sample-length 0 --no-progress --overlap-forward-micro-batches)
expect_error pair_one_micro_batch "needs two or more micro-batches per iteration, but --global-batch-size 4 / \(--micro-batch-size 4 × data-parallel size 1\) gives 1; use --micro-batch-size 2 \(2 micro-batches per iteration" 0 -- train "${T[@]}" --global-batch-size 4
expect_error pair_one_micro_batch_divisor "gives 1; use --micro-batch-size 1 \(5 micro-batches per iteration" 0 -- train "${T[@]}" --micro-batch-size 5 --global-batch-size 5
expect_error pair_recompute "--overlap-forward-micro-batches with recomputation \(--recompute-granularity selective, or --recompute-activations\) is not supported" 0 -- train "${T[@]}" --recompute-granularity selective
expect_error pair_moe "--overlap-forward-micro-batches with --num-experts 4 is not supported" 0 -- train "${T[@]}" --num-experts 4
expect_error pair_pipeline "--overlap-forward-micro-batches with --pipeline-model-parallel-size 2 is not supported" 2 -- train "${T[@]}" --pipeline-model-parallel-size 2 --num-layers 4
expect_error pair_ring "--overlap-forward-micro-batches with ring attention" 2 -- train "${T[@]}" --context-parallel-size 2
expect_error pair_sharded "--overlap-forward-micro-batches with a sharded --data-parallel-sharding-strategy" 2 -- train "${T[@]}" --data-parallel-sharding-strategy optim_grads
expect_error pair_baseline_one_micro_batch "bench train --baseline: on the baseline's side --overlap-forward-micro-batches needs two or more micro-batches per iteration" 0 -- bench train --train-iters 10 --global-batch-size 4 --baseline "--overlap-forward-micro-batches"
expect_error pair_baseline_recompute "on the baseline's side .* or give --baseline \"--no-overlap-forward-micro-batches\"" 0 -- bench train --train-iters 10 --micro-batch-size 2 --global-batch-size 8 --overlap-forward-micro-batches --baseline "--recompute-granularity selective"
expect_error pair_switch_value "--overlap-forward-micro-batches is a switch: give it alone" 0 -- train --overlap-forward-micro-batches=maybe
# The flag changes the order of the TP collectives: ranks launched with and without it fail at start-up, naming it.
printf '#!/bin/bash\nif [ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = 0 ]; then exec "$@" --overlap-forward-micro-batches; fi\nexec "$@"\n' >"$TMP/one_rank.sh"
chmod +x "$TMP/one_rank.sh"
timeout 120 "$LAUNCH" -n 2 -- "$TMP/one_rank.sh" "$COC" train --tp 2 "${pair[@]:1}" --train-iters 2 --sample-length 0 \
  >"$TMP/mismatch.out" 2>"$TMP/mismatch.err"
check "pair_on_one_rank_only: ranks disagree on the training configuration" grep -q \
  "coc: error: ranks disagree on the training configuration" "$TMP/mismatch.err"
timeout 60 "$COC" train --train-iters 1 --sample-length 0 --micro-batch-size 2 --global-batch-size 4 \
  --overlap-forward-micro-batches >"$TMP/tp1.out" 2>&1
check "pair_at_tp1 warns that there is nothing to overlap" grep -q \
  "warning: --overlap-forward-micro-batches at tp 1: the forward has no tensor-parallel transfers" "$TMP/tp1.out"
finish
