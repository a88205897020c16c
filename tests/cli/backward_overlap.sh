#!/usr/bin/env bash
# coc-test-timeout: 900
# The backward overlaps (docs/semantics.md §2): --tp-comm-bulk-wgrad and --delay-wgrad-compute, each on and off,
# at tp 2-4 with sequence parallelism on and off, and --delay-column-wgrad (sequence parallelism only) on and off
# with both vocabulary communications (--vocab-parallel-comm), and the attention pipelines (--attention-dense-pipeline,
# --attention-dense-backward-pipeline). `coc check --train-steps --deterministic` compares the run against
# the plain order with both switches off (tolerance 0: the overlaps must not change a bit), and `coc check --layer`
# compares each layer against the fp64 single-rank reference.
source "$(dirname "$0")/common.bash"

PASSES_TIMEOUT=300  # the train checks at tp 4 take minutes under load

bitwise() {  # bitwise NAME: the train check's loss curve equals the plain order's in every bit
  check "$1: 0 difference to the plain order" grep -q "vs N=1: *max relative loss difference 0.000e+00" "$TMP/$1.out"
}

small=(--micro-batch-size 2 --seq-length 64 --hidden-size 96 --num-attention-heads 4 --ffn-hidden-size 192)
for switches in "" "--disable-tp-comm-bulk-wgrad" "--no-delay-wgrad-compute" \
                "--disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute"; do
  tag=$(echo "${switches:-on}" | sed 's/--//g; s/ /+/g')
  # shellcheck disable=SC2086
  for sp in "" "--sequence-parallel"; do
    for n in 1 4 auto; do
      name="train_tp2_n${n}${sp:+_sp}_$tag"
      passes_check "$name" 2 -- check --train-steps 3 --deterministic --coc-parallel-num "$n" $sp $switches "${small[@]}"
      bitwise "$name"
    done
  done
done
# --delay-column-wgrad acts only with sequence parallelism; the train checks above ran it on (the default).
for n in 1 4 auto; do
  for vocab in activations weights; do
    name="train_tp2_n${n}_sp_no-delay-column-wgrad_$vocab"
    passes_check "$name" 2 -- check --train-steps 3 --deterministic --coc-parallel-num "$n" --sequence-parallel \
      --no-delay-column-wgrad --vocab-parallel-comm "$vocab" "${small[@]}"
    bitwise "$name"
  done
done
# The attention pipelines (on by default; the check's reference runs them off) over three attention blocks of 128
# positions, the last one partial, which the projection's chunks and, with SP, the backward's gather segments (the
# SP shards hold 300 rows each) cut through.
long=(--micro-batch-size 2 --seq-length 300 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128)
for sp in "" "--sequence-parallel"; do
  for sched in "3" "8 --coc-comm-algo p2p"; do
    name="train_tp2_attention_pipeline${sp:+_sp}_n${sched%% *}"
    # shellcheck disable=SC2086
    passes_check "$name" 2 -- check --train-steps 2 --deterministic --coc-parallel-num $sched $sp "${long[@]}"
    bitwise "$name"
  done
done
passes_check train_tp3_sp 3 -- check --train-steps 2 --deterministic --tp 3 --sequence-parallel --coc-parallel-num auto \
  --micro-batch-size 3 --seq-length 63 --hidden-size 96 --num-attention-heads 6 --ffn-hidden-size 192
bitwise train_tp3_sp
passes_check train_tp4_sp 4 -- check --train-steps 2 --deterministic --tp 4 --sequence-parallel --coc-parallel-num 4 \
  "${small[@]}"
bitwise train_tp4_sp
passes_check train_tp4_nosp 4 -- check --train-steps 2 --deterministic --tp 4 --coc-parallel-num 1 "${small[@]}"
bitwise train_tp4_nosp

for layer in column row; do
  for sp in "" "--sequence-parallel"; do
    for switches in "" "--disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute"; do
      # shellcheck disable=SC2086
      passes_check "layer_${layer}${sp:+_sp}${switches:+_off}" 3 -- check --layer "$layer" $sp $switches --m 301 \
        --k 64 --n 48 --bias --coc-parallel-num auto
    done
  done
done

# coc bench train switches them between iterations: the backward overlaps against the run without them, with the
# deterministic loss curve of a plain coc train.
tiny=(--micro-batch-size 2 --seq-length 64 --hidden-size 96 --num-attention-heads 4 --ffn-hidden-size 192
      --sequence-parallel --deterministic --train-iters 6 --global-batch-size 4 --coc-parallel-num auto
      --lr 1e-3 --min-lr 1e-4)  # bench train's learning rates
check "bench train --baseline switches the backward overlaps" bash -c "timeout 300 '$LAUNCH' -n 2 -- '$COC' bench train \
  ${tiny[*]} --skip-pairs 1 --baseline '--disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute' >'$TMP/ab.out' 2>&1"
grep -o "loss [0-9.]*" "$TMP/ab.out" | head -6 >"$TMP/ab.losses"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${tiny[@]}" --sample-length 0 --disable-tp-comm-bulk-wgrad \
  --no-delay-wgrad-compute 2>&1 | grep -o "loss [0-9.]*" | head -6 >"$TMP/plain.losses"
check "bench train --baseline: deterministic losses equal a plain coc train without the overlaps" bash -c \
  "[ \$(wc -l <'$TMP/ab.losses') = 6 ] && cmp '$TMP/ab.losses' '$TMP/plain.losses'"

help=$("$COC" train --help 2>&1)
for flag in --tp-comm-bulk-wgrad --disable-tp-comm-bulk-wgrad --delay-wgrad-compute --no-delay-wgrad-compute \
            --delay-column-wgrad --no-delay-column-wgrad --vocab-parallel-comm --comm-nonblocking-impl \
            --attention-dense-pipeline --no-attention-dense-pipeline --attention-dense-backward-pipeline \
            --no-attention-dense-backward-pipeline --swiglu-down-pipeline --no-swiglu-down-pipeline \
            --attention-qkv-backward-pipeline --no-attention-qkv-backward-pipeline --swiglu-down-backward-pipeline \
            --no-swiglu-down-backward-pipeline; do
  check "train --help lists $flag" grep -q -- "$flag" <<<"$help"
done
expect_error bulk_wgrad_takes_no_value "tp-comm-bulk-wgrad" 2 -- train --tp-comm-bulk-wgrad=sometimes
expect_error unknown_vocab_comm "unknown --vocab-parallel-comm 'rows'" 2 -- train --vocab-parallel-comm rows
expect_error unknown_nonblocking_impl "unknown --comm-nonblocking-impl 'nccl'" 2 -- train --comm-nonblocking-impl nccl
expect_error vocab_weights_need_sp "needs --sequence-parallel" 2 -- train --no-sequence-parallel \
  --vocab-parallel-comm weights --train-iters 1
expect_error vocab_comm_not_switchable "vocab-parallel-comm" 2 -- bench train --train-iters 2 \
  --baseline '--vocab-parallel-comm activations'
finish
