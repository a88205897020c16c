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
same "pp 2, uneven split 1 + 3 layers, vs pp 1" 1 2 --tp 1 -- "${PP2[@]}" --decoder-first-pipeline-num-layers 1
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
expect_error pp_cp "--context-parallel-size 2 is not supported with --pipeline-model-parallel-size 2 yet" 4 -- train \
  "${PP2[@]}" --tp 1 --num-layers 4 --context-parallel-size 2
expect_error overlap_p2p_without_pp "--overlap-p2p-communication .* needs --pipeline-model-parallel-size > 1" 1 -- \
  train --overlap-p2p-communication
expect_error bench_baseline_pp "coc bench train --baseline is not supported with --pipeline-model-parallel-size 2" \
  2 -- bench train "${PP2[@]}" --tp 1 --num-layers 4 --baseline "--coc-parallel-num 1"
finish
