#!/usr/bin/env bash
# coc-test-timeout: 900
# The interleaved 1F1B schedule (issue 34; model/pipeline_schedule.h, docs/pipeline.md): coc train with
# --pipeline-model-parallel-size P and V = --num-virtual-stages-per-pipeline-rank (or
# --num-layers-per-virtual-pipeline-stage) model chunks per rank gives, under --deterministic, bitwise the losses of
# the same tp and dp without stages (launched on fewer ranks): pp 2 × V 2 on 4 and 8 layers, tp 2 × pp 2 × V 2 with
# SP, --overlap-p2p-communication, pp 4 × V 2 with M = P, M = P = 2, pp 2 × dp 2 with --overlap-grad-reduce, --bf16,
# activation recomputation (selective, full uniform and block, per virtual stage), the validation loss and sampling.
# A checkpoint saved at pp 2 × V 2 resumes bitwise at V 2, pp 1 and pp 2 × V 1, and one of pp 2 × V 1 at V 2. Each
# bad input is one line.
source "$(dirname "$0")/common.bash"
C=(--train-iters 3 --num-layers 4 --seq-length 64 -v --no-progress --sample-length 0)
source "$(dirname "$0")/pipeline_common.bash"
V2=(--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2)
same "pp 2 x V 2 (4 layers) vs pp 1" 1 2 --tp 1 -- "${V2[@]}"
check "the start-up line names the chunks and the interleaved bubble" grep -q \
  "pipeline: 2 stages (layers 0-0+2-2, 1-1+3-3; .*interleaved 1F1B (2 virtual stages per rank) over 4 micro-batches (bubble (P-1)/(V·M+P-1) = 11%)" \
  "$TMP/last"
same "pp 2, --num-layers-per-virtual-pipeline-stage 2 (8 layers, V 2) vs pp 1" 1 2 --tp 1 --num-layers 8 -- \
  --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2
check "8 layers, N 2: stage 0 holds layers 0-1 and 4-5" grep -q "pipeline stage 0: layers 0-1+4-5, embedding" \
  "$TMP/last"
same "pp 2 x V 2 --virtual-pipeline-model-parallel-size (alias) --overlap-p2p-communication vs pp 1" 1 2 --tp 1 -- \
  --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 --overlap-p2p-communication
same "pp 2 x V 2 with M = P = 2 micro-batches vs pp 1" 1 2 --tp 1 --global-batch-size 8 -- "${V2[@]}"
same "tp 2 x pp 2 x V 2 (sequence parallel) vs tp 2" 2 4 --tp 2 --sequence-parallel -- "${V2[@]}"
same "pp 4 x V 2 (8 layers, M = P = 4) --overlap-p2p-communication vs pp 1" 1 4 --tp 1 --num-layers 8 -- \
  --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --overlap-p2p-communication
same "pp 2 x V 2 x dp 2 --overlap-grad-reduce vs dp 2 --overlap-grad-reduce" 2 4 --tp 1 --global-batch-size 16 \
  --overlap-grad-reduce -- "${V2[@]}"
same "pp 2 x V 2 --bf16 vs pp 1" 1 2 --tp 1 --bf16 -- "${V2[@]}"

# Activation recomputation per model chunk (--recompute-num-layers counts one virtual stage's layers, as in
# Megatron-core), against pp 1 without recomputation (a small model: hidden 64).
SMALL=(--tp 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128)
same "pp 2 x V 2 selective recomputation vs pp 1 without" 1 2 "${SMALL[@]}" -- "${V2[@]}" \
  --recompute-granularity selective
same "pp 2 x V 2 full uniform recomputation (8 layers, 2 a virtual stage) vs pp 1 without" 1 2 "${SMALL[@]}" \
  --num-layers 8 -- "${V2[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
check "the start-up line counts the recomputed layers per virtual stage" grep -q \
  "recompute: full, --recompute-method uniform --recompute-num-layers 2 per virtual stage: 8 of 8 layers" "$TMP/last"
same "pp 2 x V 2 full block recomputation (1 of 2 layers a virtual stage) --overlap-p2p-communication vs pp 1" 1 2 \
  "${SMALL[@]}" --num-layers 8 -- "${V2[@]}" --overlap-p2p-communication --recompute-granularity full \
  --recompute-method block --recompute-num-layers 1
check "block 1 per virtual stage recomputes 4 of 8 layers" grep -q "per virtual stage: 4 of 8 layers" "$TMP/last"

# The validation loss and sampling go through the virtual stages too.
val() { grep "validation loss at iteration 3 on validation set" "$TMP/last" | grep "rank 0" | sed 's/.*: //'; }
losses 1 --tp 1 --deterministic --eval-iters 1 --split 90,10,0 > /dev/null; val > "$TMP/va"
losses 2 --tp 1 --deterministic --eval-iters 1 --split 90,10,0 "${V2[@]}" > /dev/null; val > "$TMP/vb"
check "validation loss of pp 2 x V 2 equals pp 1 ($(cat "$TMP/va"))" bash -c "[ -s '$TMP/va' ] && cmp -s '$TMP/va' '$TMP/vb'"
S=(--train-iters 3 --num-layers 4 --seq-length 64 --no-progress --tp 1 --deterministic --sample-length 24)
timeout 300 "$LAUNCH" -n 1 -- "$COC" train "${S[@]}" 2>/dev/null | sample > "$TMP/s1"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${S[@]}" "${V2[@]}" 2>/dev/null | sample > "$TMP/s2"
check "pp 2 x V 2 samples the bytes pp 1 samples" bash -c "[ -s '$TMP/s1' ] && cmp -s '$TMP/s1' '$TMP/s2'"

# Without --deterministic: within 1e-6.
losses 1 --tp 1 > "$TMP/na"
losses 2 --tp 1 "${V2[@]}" > "$TMP/nb"
near "pp 2 x V 2 vs pp 1 without --deterministic: within 1e-6" "$TMP/na" "$TMP/nb"

# Checkpoints: pp 2 x V 2 resumes bitwise, at V 2 and at other layouts (pp 1, pp 2 without virtual stages), and a
# pp 2 checkpoint resumes at pp 2 x V 2.
R=(--tp 1 --deterministic --train-iters 4)
losses 2 "${R[@]}" "${V2[@]}" > "$TMP/whole"
losses 2 "${R[@]}" "${V2[@]}" --exit-interval 2 --save "$TMP/ckpt" > /dev/null
losses 2 "${R[@]}" --pipeline-model-parallel-size 2 --exit-interval 2 --save "$TMP/ckpt1" > /dev/null
resumed() {  # resumed NAME CKPT RANKS FLAGS...: resuming CKPT continues $TMP/whole bit for bit
  local name="$1" ckpt="$2" n="$3"; shift 3
  losses "$n" "${R[@]}" --load "$ckpt" "$@" > "$TMP/resumed"
  check "$name ($(wc -l < "$TMP/resumed") losses)" bash -c \
    "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
}
resumed "pp 2 x V 2 resumed from its checkpoint at iteration 2 continues bitwise" "$TMP/ckpt" 2 "${V2[@]}"
resumed "the pp 2 x V 2 checkpoint resumed at pp 1 continues bitwise" "$TMP/ckpt" 1
resumed "the pp 2 x V 2 checkpoint resumed at pp 2 (V 1) continues bitwise" "$TMP/ckpt" 2 \
  --pipeline-model-parallel-size 2
resumed "the pp 2 (V 1) checkpoint resumed at pp 2 x V 2 continues bitwise" "$TMP/ckpt1" 2 "${V2[@]}"

PASSES_TIMEOUT=300 passes_check check_pp_v 2 -- check --train-steps 3 --num-layers 4 --seq-length 64 --deterministic \
  --tp 1 "${V2[@]}"

# Bad input, one line each.
expect_error m_not_multiple_of_p "needs the micro-batches per iteration, 3 = --global-batch-size / \(--micro-batch-size × dp\), to be a multiple of --pipeline-model-parallel-size 2" \
  2 -- train --tp 1 --num-layers 4 "${V2[@]}" --micro-batch-size 2 --global-batch-size 6
expect_error layers_not_divisible_pv "--num-layers 6 is not divisible by --pipeline-model-parallel-size 2 × --num-virtual-stages-per-pipeline-rank 2 = 4" \
  2 -- train --tp 1 --num-layers 6 "${V2[@]}"
expect_error layers_not_divisible_pn "--num-layers 4 is not divisible by --pipeline-model-parallel-size 2 × --num-layers-per-virtual-pipeline-stage 3 = 6" \
  2 -- train --tp 1 --num-layers 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3
expect_error v_without_pp "--num-virtual-stages-per-pipeline-rank 2 \(the interleaved schedule\) needs --pipeline-model-parallel-size > 1" \
  1 -- train --tp 1 --num-layers 4 --num-virtual-stages-per-pipeline-rank 2
expect_error n_without_pp "--num-layers-per-virtual-pipeline-stage 1 \(the interleaved schedule\) needs --pipeline-model-parallel-size > 1" \
  1 -- train --tp 1 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1
expect_error both_v_flags "--num-layers-per-virtual-pipeline-stage 1 and --num-virtual-stages-per-pipeline-rank 2 are mutually exclusive" \
  2 -- train --tp 1 --num-layers 4 "${V2[@]}" --num-layers-per-virtual-pipeline-stage 1
expect_error v_uneven_split "--decoder-first/last-pipeline-num-layers with --num-virtual-stages-per-pipeline-rank 2 is not supported yet" \
  2 -- train --tp 1 --num-layers 8 "${V2[@]}" --decoder-first-pipeline-num-layers 2
expect_error v_zero "--num-virtual-stages-per-pipeline-rank: must be an integer >= 1 \(got .0.\)" 2 -- train --tp 1 --num-layers 4 \
  --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 0
finish
