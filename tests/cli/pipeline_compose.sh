#!/usr/bin/env bash
# coc-test-timeout: 900
# Pipeline parallelism composed with the other dimensions (issue 34; docs/pipeline.md): under --deterministic,
# --pipeline-model-parallel-size 2 gives bitwise the losses of the same flags without stages (launched on half the
# ranks) with sharded data parallelism (ZeRO-1/2/3: --data-parallel-sharding-strategy optim, optim_grads,
# optim_grads_params, the last also with --bf16), and a checkpoint saved at pp 2 × dp 2 under ZeRO-3 resumes
# bitwise; MoE models (ep 1 and 2, a stage without experts, with ZeRO-3, a checkpoint that also resumes at pp 1 and
# that coc convert re-cuts to pp 1 and back byte for byte) likewise, and activation
# recomputation (selective, full uniform and block, each micro-batch in flight keeping its chunks' inputs); ZeRO-3
# and MoE also under the interleaved schedule (2 virtual stages), together with recomputation per virtual stage.
source "$(dirname "$0")/common.bash"
C=(--train-iters 3 --num-layers 4 --seq-length 64 -v --no-progress --sample-length 0 --tp 1)
source "$(dirname "$0")/pipeline_common.bash"
PP2=(--pipeline-model-parallel-size 2)
DP2=(--global-batch-size 16)  # M = 4 micro-batches per dp rank at dp 2

# Sharded data parallelism: each stage shards its own parameters over its dp group.
for s in optim optim_grads optim_grads_params; do
  same "pp 2 x dp 2 --data-parallel-sharding-strategy $s vs dp 2" 2 4 "${DP2[@]}" \
    --data-parallel-sharding-strategy "$s" -- "${PP2[@]}"
done
same "pp 2 x dp 2 optim_grads_params --bf16 vs dp 2" 2 4 "${DP2[@]}" --bf16 \
  --data-parallel-sharding-strategy optim_grads_params -- "${PP2[@]}"
same "pp 2 x dp 2 optim_grads_params, no prefetch, --overlap-p2p-communication, vs dp 2" 2 4 "${DP2[@]}" \
  --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 0 --num-to-backward-prefetch 0 \
  -- "${PP2[@]}" --overlap-p2p-communication
same "pp 2 x V 2 (interleaved) x dp 2 optim_grads_params vs dp 2" 2 4 "${DP2[@]}" \
  --data-parallel-sharding-strategy optim_grads_params -- "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2

# A checkpoint at pp 2 × dp 2 under ZeRO-3: each stage gathers its shards and writes them; a resumed run continues
# the losses bit for bit.
R=(--deterministic --train-iters 4 "${DP2[@]}" "${PP2[@]}" --data-parallel-sharding-strategy optim_grads_params)
losses 4 "${R[@]}" > "$TMP/whole"
losses 4 "${R[@]}" --exit-interval 2 --save "$TMP/ckpt" > /dev/null
losses 4 "${R[@]}" --load "$TMP/ckpt" > "$TMP/resumed"
check "pp 2 x dp 2 ZeRO-3 resumed from its checkpoint at iteration 2 continues bitwise ($(wc -l < "$TMP/resumed") losses)" \
  bash -c "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
check "each stage wrote its shard" test -f "$TMP/ckpt/iter_0000002/mp_rank_00_dp_001.ckpt"
R1=(--deterministic --train-iters 4 "${DP2[@]}" "${PP2[@]}" --data-parallel-sharding-strategy optim)
losses 4 "${R1[@]}" --load "$TMP/ckpt" > "$TMP/resumed1"
check "the ZeRO-3 checkpoint resumes under ZeRO-1 at pp 2 bitwise" \
  bash -c "[ -s '$TMP/resumed1' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed1'"

# MoE: the expert layers run on the stage that holds them; each in-flight micro-batch keeps its routing and expert
# activations with its other activations (MoeLayer::plan). ep 1 and ep 2, and a first stage without experts
# (--first-k-dense-replace 2: the expert norm is still reduced on every stage).
MOE=(--model-preset tiny-moe --num-layers 4)
lbl() { grep '^ iteration' "$TMP/last" | grep -o 'load_balancing_loss [0-9.E+-]*'; }
same "MoE pp 2 vs pp 1" 1 2 "${MOE[@]}" -- "${PP2[@]}"
lbl > "$TMP/lb"; losses 1 --deterministic "${MOE[@]}" > /dev/null; lbl > "$TMP/la"
check "the MoE load-balancing loss adds the stages' layers ($(tail -1 "$TMP/la"))" bash -c \
  "[ -s '$TMP/la' ] && cmp -s '$TMP/la' '$TMP/lb'"
same "MoE tp 2 x pp 2 vs tp 2 (experts replicated over tp: every tp rank runs the expert norm)" 2 4 "${MOE[@]}" \
  --tp 2 --no-sequence-parallel -- "${PP2[@]}"
same "MoE pp 2 x ep 2 vs ep 2" 2 4 "${MOE[@]}" "${DP2[@]}" --expert-model-parallel-size 2 -- "${PP2[@]}"
same "MoE pp 2 x ep 2, dense first stage, vs ep 2" 2 4 "${MOE[@]}" "${DP2[@]}" --expert-model-parallel-size 2 \
  --first-k-dense-replace 2 -- "${PP2[@]}" --overlap-p2p-communication
same "MoE pp 2 x ep 2 --data-parallel-sharding-strategy optim_grads_params vs ep 2" 2 4 "${MOE[@]}" "${DP2[@]}" \
  --expert-model-parallel-size 2 --data-parallel-sharding-strategy optim_grads_params -- "${PP2[@]}"
same "MoE pp 2 x V 2 (interleaved) x ep 2 vs ep 2" 2 4 "${MOE[@]}" "${DP2[@]}" --expert-model-parallel-size 2 \
  -- "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2

# A MoE checkpoint at pp 2 × ep 2: one shard per stage and ep rank (the last field: stage × ep + ep rank).
R=(--deterministic --train-iters 4 "${MOE[@]}" "${DP2[@]}" "${PP2[@]}" --expert-model-parallel-size 2)
losses 4 "${R[@]}" > "$TMP/whole"
losses 4 "${R[@]}" --exit-interval 2 --save "$TMP/mckpt" > /dev/null
losses 4 "${R[@]}" --load "$TMP/mckpt" > "$TMP/resumed"
check "MoE pp 2 x ep 2 resumed from its checkpoint continues bitwise ($(wc -l < "$TMP/resumed") losses)" bash -c \
  "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
check "four MoE shards (2 stages x 2 ep ranks)" test -f "$TMP/mckpt/iter_0000002/mp_rank_00_dp_003.ckpt"
# At another pipeline layout each rank reads its tensors from the stage shards of its ep rank (its experts).
losses 2 --deterministic --train-iters 4 "${MOE[@]}" "${DP2[@]}" --expert-model-parallel-size 2 --load "$TMP/mckpt" \
  > "$TMP/resumed"
check "MoE pp 2 x ep 2 resumed at pp 1 continues bitwise ($(wc -l < "$TMP/resumed") losses)" bash -c \
  "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
# coc convert re-cuts it per ep rank: to pp 1 and back to pp 2 gives the same files, byte for byte.
"$COC" convert --loader coc --saver coc --load-dir "$TMP/mckpt" --save-dir "$TMP/m1" --target-pipeline-parallel-size 1 \
  > /dev/null && "$COC" convert --loader coc --saver coc --load-dir "$TMP/m1" --save-dir "$TMP/m2" \
  --target-pipeline-parallel-size 2 > /dev/null
check "MoE pp 2 x ep 2 re-cut to pp 1 and back by coc convert: the same shards byte for byte" bash -c \
  "for f in '$TMP'/mckpt/iter_0000002/*.ckpt; do cmp -s \"\$f\" '$TMP/m2/iter_0000002/'\$(basename \"\$f\") || exit 1; done"

# Activation recomputation: --recompute-num-layers counts one stage's layers (Megatron's rule).
same "pp 2 --recompute-granularity selective vs pp 1" 1 2 --recompute-granularity selective -- "${PP2[@]}"
same "pp 2 full uniform recomputation (2 layers a chunk) vs pp 1" 1 2 --recompute-granularity full \
  --recompute-method uniform --recompute-num-layers 2 -- "${PP2[@]}"
same "pp 2 full block recomputation (1 layer) x ZeRO-3 vs dp 2" 2 4 "${DP2[@]}" --recompute-granularity full \
  --recompute-method block --recompute-num-layers 1 --data-parallel-sharding-strategy optim_grads_params -- "${PP2[@]}"
same "MoE pp 2 x ep 2, full uniform recomputation (1 layer), vs ep 2" 2 4 "${MOE[@]}" "${DP2[@]}" \
  --expert-model-parallel-size 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
  -- "${PP2[@]}"
expect_error recompute_layers_per_stage "--recompute-num-layers 3 counts the layers of one pipeline stage: pass at most 2" \
  2 -- train "${PP2[@]}" --tp 1 --num-layers 4 --recompute-granularity full --recompute-method block \
  --recompute-num-layers 3
# Under the interleaved schedule each model chunk recomputes on its own (--recompute-num-layers counts the layers of
# one virtual stage, Megatron-core's rule), here with MoE layers and ZeRO-3's gathers in the recomputed chunks.
# (A small model: hidden 64.)
same "MoE pp 2 x V 2 x ep 2 ZeRO-3, full uniform recomputation (1 layer a virtual stage), vs ep 2" 2 4 "${MOE[@]}" \
  --hidden-size 64 --num-attention-heads 4 --moe-ffn-hidden-size 128 "${DP2[@]}" --expert-model-parallel-size 2 \
  --data-parallel-sharding-strategy optim_grads_params -- "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 \
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
expect_error recompute_layers_per_virtual_stage "--recompute-num-layers 2 counts the layers of one pipeline virtual stage \(model chunk\): pass at most 1" \
  2 -- train "${PP2[@]}" --tp 1 --num-layers 4 --num-virtual-stages-per-pipeline-rank 2 --recompute-granularity full \
  --recompute-method block --recompute-num-layers 2
finish
