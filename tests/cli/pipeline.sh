#!/usr/bin/env bash
# coc-test-timeout: 900
# Pipeline parallelism (issue 34; model/pipeline_schedule.h, docs/pipeline.md): coc train with
# --pipeline-model-parallel-size 2 gives, under --deterministic, bitwise the losses of the same tp and dp without
# stages (launched on fewer ranks): pp 2, tp 2 × pp 2 with SP, pp 2 × dp 2, an odd micro-batch count (M = 3), an
# uneven layer split, --overlap-p2p-communication, --bf16 (2-byte stage transfers), --overlap-grad-reduce, pp 4
# (also with M < P) and the validation loss; without
# --deterministic within 1e-6. coc check --train-steps compares pp 2 with pp 1. A checkpoint saved at pp 2 resumes
# bitwise at pp 2, pp 1, pp 4 and an uneven split, and coc convert exports it. Each unsupported combination and each
# bad size is one clear line.
source "$(dirname "$0")/common.bash"
C=(--train-iters 3 --num-layers 4 --seq-length 64 -v --no-progress --sample-length 0)
source "$(dirname "$0")/pipeline_common.bash"
PP2=(--pipeline-model-parallel-size 2)
same "pp 2 vs pp 1" 1 2 --tp 1 -- "${PP2[@]}"
same "tp 2 x pp 2 (sequence parallel) vs tp 2" 2 4 --tp 2 --sequence-parallel -- "${PP2[@]}"
same "pp 2 x dp 2 vs dp 2" 2 4 --tp 1 --global-batch-size 16 -- "${PP2[@]}"
same "pp 2 with M = 3 micro-batches vs pp 1" 1 2 --tp 1 --micro-batch-size 2 --global-batch-size 6 -- "${PP2[@]}"
same "pp 2, uneven split 1 + 3 layers, Megatron's --no-overlap-p2p-communication, vs pp 1" 1 2 --tp 1 -- \
  "${PP2[@]}" --decoder-first-pipeline-num-layers 1 --no-overlap-p2p-communication
same "pp 2 --overlap-p2p-communication vs pp 1" 1 2 --tp 1 -- "${PP2[@]}" --overlap-p2p-communication
same "pp 2 --bf16 (2-byte stage transfers) vs pp 1" 1 2 --tp 1 --bf16 -- "${PP2[@]}"
same "pp 2 --overlap-grad-reduce vs pp 1 --overlap-grad-reduce" 2 4 --tp 1 --global-batch-size 16 \
  --overlap-grad-reduce -- "${PP2[@]}"
same "pp 4 --overlap-p2p-communication vs pp 1" 1 4 --tp 1 -- --pipeline-model-parallel-size 4 \
  --overlap-p2p-communication
same "pp 4 with M = 2 < P micro-batches vs pp 1" 1 4 --tp 1 --global-batch-size 8 -- \
  --pipeline-model-parallel-size 4
same "pp 4, threaded progress engine, --debug-collectives, vs pp 1" 1 4 --tp 1 -- --pipeline-model-parallel-size 4 \
  --comm-engine thread --debug-collectives --overlap-p2p-communication

# Every rank logs the same loss (the last stage's, broadcast over pp).
losses 2 --tp 1 "${PP2[@]}" --deterministic > /dev/null
check "every rank logs the last stage's loss" bash -c \
  "[ \$(grep -o 'iteration 3: .*loss [0-9.]*' '$TMP/last' | sed 's/.*loss //' | sort -u | wc -l) = 1 ]"
check "the start-up line names the stages and the schedule" grep -q "pipeline: 2 stages (layers 0-1, 2-3" "$TMP/last"
check "the memory line is printed per stage" grep -q "memory per rank" "$TMP/last"

# The validation loss goes through the stages too.
val() { grep "validation loss at iteration 3 on validation set" "$TMP/last" | grep "rank 0" | sed 's/.*: //'; }
losses 1 --tp 1 --deterministic --eval-iters 1 --split 90,10,0 > /dev/null; val > "$TMP/va"
losses 2 --tp 1 --deterministic --eval-iters 1 --split 90,10,0 "${PP2[@]}" > /dev/null; val > "$TMP/vb"
check "validation loss of pp 2 equals pp 1 ($(cat "$TMP/va"))" bash -c "[ -s '$TMP/va' ] && cmp -s '$TMP/va' '$TMP/vb'"

# Sampling and --logits-out run through the stages: the same bytes and logits as pp 1.
S=(--train-iters 3 --num-layers 4 --seq-length 64 --no-progress --tp 1 --deterministic --sample-length 24)
timeout 300 "$LAUNCH" -n 1 -- "$COC" train "${S[@]}" --logits-out "$TMP/l1" 2>/dev/null | sample > "$TMP/s1"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${S[@]}" --logits-out "$TMP/l2" "${PP2[@]}" 2>/dev/null | sample > "$TMP/s2"
check "pp 2 samples the bytes pp 1 samples" bash -c "[ -s '$TMP/s1' ] && cmp -s '$TMP/s1' '$TMP/s2'"
check "pp 2 --logits-out writes pp 1's logits" bash -c "[ -s '$TMP/l1' ] && cmp -s '$TMP/l1' '$TMP/l2'"

# Without --deterministic: within 1e-6.
losses 1 --tp 1 > "$TMP/na"
losses 2 --tp 1 "${PP2[@]}" > "$TMP/nb"
near "pp 2 vs pp 1 without --deterministic: within 1e-6" "$TMP/na" "$TMP/nb"

# Checkpoints: each stage writes its own shard; a resumed run continues the losses bit for bit, at the same pp and at
# another pp or layer split (each rank reads its layers from the stage shards that hold them). coc convert merges the
# stages (tests/cli/convert_pipeline.sh checks its output).
R=(--tp 1 --deterministic --train-iters 4)
losses 2 "${R[@]}" "${PP2[@]}" > "$TMP/whole"
losses 2 "${R[@]}" "${PP2[@]}" --exit-interval 2 --save "$TMP/ckpt" > /dev/null
check "each stage wrote its shard" test -f "$TMP/ckpt/iter_0000002/mp_rank_00_dp_001.ckpt"
resumed() {  # resumed NAME RANKS FLAGS...: resuming $TMP/ckpt continues $TMP/whole bit for bit
  local name="$1" n="$2"; shift 2
  losses "$n" "${R[@]}" --load "$TMP/ckpt" "$@" > "$TMP/resumed"
  check "$name ($(wc -l < "$TMP/resumed") losses)" bash -c \
    "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
}
resumed "pp 2 resumed from its checkpoint at iteration 2 continues bitwise" 2 "${PP2[@]}"
resumed "the pp 2 checkpoint resumed at pp 1 continues bitwise" 1
resumed "the pp 2 checkpoint resumed at pp 4 continues bitwise" 4 --pipeline-model-parallel-size 4
resumed "the pp 2 checkpoint resumed with the split 1 + 3 continues bitwise" 2 "${PP2[@]}" \
  --decoder-first-pipeline-num-layers 1
check "coc convert merges the pp 2 checkpoint's stages into a Hugging Face folder" "$COC" convert --loader coc \
  --saver hf --load-dir "$TMP/ckpt" --save-dir "$TMP/hf"

PASSES_TIMEOUT=300 passes_check check_pp 2 -- check --train-steps 3 --num-layers 4 --seq-length 64 --deterministic \
  --tp 1 "${PP2[@]}"

expect_error layers_not_divisible "--num-layers 3 is not divisible by --pipeline-model-parallel-size 2" 2 -- train \
  "${PP2[@]}" --tp 1
expect_error pp_not_dividing_world "world size 3 .*--pipeline-model-parallel-size 2" 3 -- train "${PP2[@]}" \
  --tp 1 --num-layers 4
expect_error uneven_split_bad "leaves 3 layers for the 2 other stages" 3 -- train --pipeline-model-parallel-size 3 \
  --tp 1 --num-layers 4 --decoder-first-pipeline-num-layers 1
expect_error overlap_p2p_without_pp "--overlap-p2p-communication .* needs --pipeline-model-parallel-size > 1" 1 -- \
  train --overlap-p2p-communication
expect_error bench_baseline_overlap_p2p_without_pp "--overlap-p2p-communication .* needs --pipeline-model-parallel-size > 1" \
  1 -- bench train --tp 1 --train-iters 2 --skip-pairs 0 --baseline "--overlap-p2p-communication"

# Context parallelism inside each stage (a small model: hidden 64): each stage's cp ranks run the ring over their
# own cp group and send their own sequence shard to the next stage. Bitwise cp 2 at pp 1; cp 1 within the ring's
# tolerance (1e-5, tests/cli/ring_attention.sh). The sample and the --logits-out logits are cp 2's too.
SMALL=(--hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128)
CP2=(--tp 1 --context-parallel-size 2 --use-cp-send-recv-overlap "${SMALL[@]}")
same "cp 2 x pp 2 (4 ranks) vs cp 2" 2 4 "${CP2[@]}" -- "${PP2[@]}" --overlap-p2p-communication
losses 1 --deterministic --tp 1 "${SMALL[@]}" > "$TMP/cp1"
near "cp 2 x pp 2 vs cp 1 x pp 1 within 1e-5" "$TMP/cp1" "$TMP/b" 1e-5
S=(--train-iters 1 --num-layers 4 --seq-length 64 --no-progress --deterministic --sample-length 16 "${CP2[@]}")
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${S[@]}" --logits-out "$TMP/c1" 2>/dev/null | sample > "$TMP/cs1"
timeout 300 "$LAUNCH" -n 4 -- "$COC" train "${S[@]}" --logits-out "$TMP/c2" "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 \
  2>/dev/null | sample > "$TMP/cs2"
check "cp 2 x pp 2 x V 2 samples cp 2's bytes and writes its logits" bash -c \
  "[ -s '$TMP/cs1' ] && cmp -s '$TMP/cs1' '$TMP/cs2' && [ -s '$TMP/c1' ] && cmp -s '$TMP/c1' '$TMP/c2'"

# coc bench train --baseline switches --overlap-p2p-communication (and --bf16, whose stage transfers are 2-byte)
# between iterations, on every stage at the same boundary; the same math on both sides gives a plain run's losses.
B=(--tp 1 "${SMALL[@]}" --train-iters 4 --lr 1e-3 --min-lr 1e-4 --deterministic)
timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train "${C[@]}" "${B[@]}" "${PP2[@]}" --skip-pairs 0 \
  --baseline "--overlap-p2p-communication" > "$TMP/bench" 2>&1
sed -n 's/^\[rank 0\] iteration \([0-9]*\): .*loss \([0-9.]*\)$/\1 \2/p' "$TMP/bench" > "$TMP/bl"
losses 1 "${B[@]}" > "$TMP/pl"
check "bench train --baseline --overlap-p2p-communication at pp 2: both sides, a plain pp 1 run's losses" bash -c \
  "grep -c '| baseline$' '$TMP/bench' | grep -qx 2 && grep -c '| run$' '$TMP/bench' | grep -qx 2 &&
   grep -q '(the baseline.s: on)' '$TMP/bench' && grep -q 'run: .* ms per iteration' '$TMP/bench' &&
   [ \$(wc -l < '$TMP/bl') = 4 ] && cmp -s '$TMP/bl' '$TMP/pl'"
timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train "${C[@]}" "${B[@]}" "${PP2[@]}" --skip-pairs 0 \
  --overlap-p2p-communication --baseline "--bf16 --recompute-granularity selective" > "$TMP/bench" 2>&1
check "bench train --baseline --bf16 at pp 2 (2-byte stage transfers on one side) runs both sides" bash -c \
  "grep -c '| baseline$' '$TMP/bench' | grep -qx 2 && grep -q 'baseline: .* ms per iteration' '$TMP/bench'"
finish
