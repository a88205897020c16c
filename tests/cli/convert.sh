#!/usr/bin/env bash
# coc-test-timeout: 300
# coc convert: a small random LLaMA-layout model with grouped-query attention (Hugging Face names, safetensors,
# made by tests/cli/hf_llama.py with numpy) converts to coc at tp 1 and 2; coc's logits on a prompt match an
# independent numpy forward of Hugging Face's LLaMA within 1e-4; exported back, it equals the original bit for bit;
# exported with --hf-dtype bf16/fp16 it is the round-to-nearest-even of the fp32 weights, and the BF16 folder loads
# back; coc train --load fine-tunes it; a coc checkpoint shard opens with the test's own safetensors reader. Shapes coc
# cannot express, missing tensors and a vocabulary or GQA config that tp cannot split are one clear error each; a
# bit-flipped shard is refused on export; --hf-dtype int8 or with --saver coc is refused; an existing --save-dir needs
# --force.
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3  # Debian's python3-numpy (scripts/setup)
H="$ROOT/tests/cli/hf_llama.py"
M=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --ffn-hidden-size 96 --seq-length 16 --sample-length 0 --no-progress)
PROMPT="The quick"  # bytes: coc's ByteTokenizer ids are the prompt's bytes (the model's vocabulary is 256)
IDS=$($PY -c "print(','.join(str(b) for b in b'$PROMPT'))")
$PY "$H" make "$TMP/hf" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 256
$PY "$H" logits "$TMP/hf" "$IDS" "$TMP/ref.npy"
for tp in 1 2; do
  "$COC" convert --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c$tp" --target-tensor-parallel-size $tp \
    >"$TMP/convert$tp.out" 2>&1
  check "hf -> coc at tp $tp" test -s "$TMP/c$tp/iter_0000000/mp_rank_0$((tp - 1))_dp_000.ckpt"
  timeout 120 "$LAUNCH" -n $tp -- "$COC" train "${M[@]}" --tensor-model-parallel-size $tp --train-iters 0 \
    --load "$TMP/c$tp" --sample-prompt "$PROMPT" --logits-out "$TMP/logits$tp.bin" >"$TMP/logits$tp.out" 2>&1
  check "tp $tp logits match the numpy Hugging Face forward within 1e-4" $PY "$H" compare "$TMP/ref.npy" \
    "$TMP/logits$tp.bin" 1e-4
  "$COC" convert --loader coc --saver hf --load-dir "$TMP/c$tp" --save-dir "$TMP/back$tp" >/dev/null 2>&1
  check "coc (tp $tp) -> hf equals the original bit for bit" $PY "$H" same "$TMP/hf" "$TMP/back$tp"
done
# --hf-dtype: the fp32 masters written as BF16 (or F16) are their round-to-nearest-even values, with torch_dtype to
# match; the BF16 folder converts back to coc, whose logits match the numpy forward of those bf16 weights, and out
# again as BF16 unchanged.
"$COC" convert --loader coc --saver hf --load-dir "$TMP/c2" --save-dir "$TMP/bf16" --hf-dtype bf16 >"$TMP/bf16.out" 2>&1
check "--hf-dtype bf16 writes BF16 tensors, the bf16 rounding of the fp32 ones" $PY "$H" rounded "$TMP/hf" \
  "$TMP/bf16" BF16
check "convert says it wrote BF16" grep -q "Hugging Face LLaMA, 2 layers, BF16" "$TMP/bf16.out"
"$COC" convert --loader coc --saver hf --load-dir "$TMP/c1" --save-dir "$TMP/f16" --hf-dtype float16 >/dev/null 2>&1
check "--hf-dtype float16 writes F16 tensors, the fp16 rounding" $PY "$H" rounded "$TMP/hf" "$TMP/f16" F16
"$COC" convert --loader coc --saver hf --load-dir "$TMP/c1" --save-dir "$TMP/f32" --hf-dtype float32 >/dev/null 2>&1
check "--hf-dtype float32 writes the fp32 values unchanged" $PY "$H" rounded "$TMP/hf" "$TMP/f32" F32
"$COC" convert --loader hf --saver coc --load-dir "$TMP/bf16" --save-dir "$TMP/c_bf16" >/dev/null 2>&1
$PY "$H" logits "$TMP/bf16" "$IDS" "$TMP/ref_bf16.npy"
timeout 120 "$LAUNCH" -n 1 -- "$COC" train "${M[@]}" --train-iters 0 --load "$TMP/c_bf16" --sample-prompt "$PROMPT" \
  --logits-out "$TMP/logits_bf16.bin" >"$TMP/logits_bf16.out" 2>&1
check "the BF16 folder loads in coc (logits of the bf16 weights within 1e-4)" $PY "$H" compare "$TMP/ref_bf16.npy" \
  "$TMP/logits_bf16.bin" 1e-4
"$COC" convert --loader coc --saver hf --load-dir "$TMP/c_bf16" --save-dir "$TMP/bf16_again" --hf-dtype bfloat16 \
  >/dev/null 2>&1
check "BF16 -> coc -> BF16 is unchanged" $PY "$H" same "$TMP/bf16" "$TMP/bf16_again"
check "a coc shard opens with the test's safetensors reader (tp 2, rank 1)" \
  $PY "$H" shard "$TMP/c2/iter_0000000/mp_rank_01_dp_000.ckpt" "$TMP/hf" 2 1
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${M[@]}" --tensor-model-parallel-size 2 --load "$TMP/c2" --train-iters 2 \
  --lr 1e-3 --save "$TMP/ft" >"$TMP/ft.out" 2>&1
check "coc train --load fine-tunes the converted model" grep -q "trained 2 iterations" "$TMP/ft.out"
check "a training checkpoint's shard opens with the test's safetensors reader" \
  $PY "$H" shard "$TMP/ft/iter_0000002/mp_rank_00_dp_000.ckpt" - 2 0

# Bad input: one clear line each, non-zero exit.
cp -r "$TMP/hf" "$TMP/tied" && $PY "$H" set "$TMP/tied" tie_word_embeddings true
expect_error convert_tied "coc cannot express this model: tie_word_embeddings" 0 -- convert --loader hf --saver coc \
  --load-dir "$TMP/tied" --save-dir "$TMP/x1"
cp -r "$TMP/hf" "$TMP/missing" && $PY "$H" drop "$TMP/missing" model.layers.1.mlp.up_proj.weight
expect_error convert_missing_tensor "has no tensor 'model.layers.1.mlp.up_proj.weight'" 0 -- convert --loader hf \
  --saver coc --load-dir "$TMP/missing" --save-dir "$TMP/x2"
expect_error convert_gqa_tp "--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4" 0 -- convert \
  --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/x3" --target-tensor-parallel-size 4
cp -r "$TMP/hf" "$TMP/tinyvocab" && $PY "$H" set "$TMP/tinyvocab" vocab_size 1
expect_error convert_vocab_tp "vocabulary of 1 tokens cannot be split over --tensor-model-parallel-size 2" 0 -- \
  convert --loader hf --saver coc --load-dir "$TMP/tinyvocab" --save-dir "$TMP/x4" --target-tensor-parallel-size 2
# Mistral's sliding window below the context changes attention: refused; a window of the whole context is plain
# causal attention, and hidden_act "swish" is SiLU: both convert.
cp -r "$TMP/hf" "$TMP/window" && $PY "$H" set "$TMP/window" sliding_window 32
expect_error convert_sliding_window "sliding_window 32 is below max_position_embeddings 64" 0 -- convert --loader hf \
  --saver coc --load-dir "$TMP/window" --save-dir "$TMP/x5"
cp -r "$TMP/hf" "$TMP/swish" && $PY "$H" set "$TMP/swish" hidden_act '"swish"' && $PY "$H" set "$TMP/swish" sliding_window 64
check "hidden_act swish and a whole-context sliding_window convert" "$COC" convert --loader hf --saver coc \
  --load-dir "$TMP/swish" --save-dir "$TMP/x6"
# A model with another RMSNorm epsilon and RoPE theta: coc train --load takes them from the checkpoint (the logits
# match without the flags), and refuses a flag that contradicts it.
cp -r "$TMP/hf" "$TMP/eps" && $PY "$H" set "$TMP/eps" rms_norm_eps 0.25 && $PY "$H" set "$TMP/eps" rope_theta 500.0
$PY "$H" logits "$TMP/eps" "$IDS" "$TMP/ref_eps.npy"
"$COC" convert --loader hf --saver coc --load-dir "$TMP/eps" --save-dir "$TMP/c_eps" >/dev/null 2>&1
timeout 120 "$LAUNCH" -n 1 -- "$COC" train "${M[@]}" --train-iters 0 --load "$TMP/c_eps" --sample-prompt "$PROMPT" \
  --logits-out "$TMP/logits_eps.bin" >"$TMP/logits_eps.out" 2>&1
check "--load takes rms_norm_eps and rope_theta from the checkpoint (logits within 1e-4)" $PY "$H" compare \
  "$TMP/ref_eps.npy" "$TMP/logits_eps.bin" 1e-4
expect_error conflicting_eps "--norm-epsilon 1e-05 conflicts with the checkpoint in --load $TMP/c_eps, trained with 0.25" 1 -- \
  train "${M[@]}" --train-iters 0 --load "$TMP/c_eps" --norm-epsilon 1e-5
# --hf-dtype takes fp32, bf16 or fp16, and only for --saver hf (coc checkpoints keep the fp32 master weights).
expect_error convert_hf_dtype_int8 "--hf-dtype 'int8' is not an element type; use fp32, bf16 or fp16" 0 -- convert \
  --loader coc --saver hf --load-dir "$TMP/c1" --save-dir "$TMP/x8" --hf-dtype int8
check "exit 2 for --hf-dtype int8" test "$last_rc" -eq 2
expect_error convert_hf_dtype_coc "--hf-dtype bf16 applies to --saver hf only.*drop --hf-dtype" 0 -- convert \
  --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/x9" --hf-dtype bf16
check "exit 2 for --hf-dtype with --saver coc" test "$last_rc" -eq 2
# A bit-flipped shard is refused on export too (exit 3, as coc train --load refuses it), not written out.
cp -r "$TMP/c2" "$TMP/flipped"
$PY -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x10; open(p, "wb").write(b)' \
  "$TMP/flipped/iter_0000000/mp_rank_01_dp_000.ckpt"
expect_error convert_flipped_bit "checkpoint $TMP/flipped/iter_0000000/mp_rank_01_dp_000.ckpt is corrupt \(CRC mismatch" 0 -- \
  convert --loader coc --saver hf --load-dir "$TMP/flipped" --save-dir "$TMP/x7"
check "exit 3 for the corrupt shard" test "$last_rc" -eq 3
# A folder that holds files is not written over without --force.
expect_error convert_existing "--save-dir $TMP/c2: the folder already holds files.*--force" 0 -- convert --loader hf \
  --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c2" --target-tensor-parallel-size 2
expect_error convert_existing_hf "--save-dir $TMP/back2: the folder already holds files" 0 -- convert --loader coc \
  --saver hf --load-dir "$TMP/c2" --save-dir "$TMP/back2"
check "--force writes over it" "$COC" convert --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c2" \
  --target-tensor-parallel-size 2 --force
# Under a launcher every process would write the same files: refused, naming the fix.
timeout 60 "$LAUNCH" -n 2 -- "$COC" convert --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/x8" \
  >"$TMP/launched.out" 2>"$TMP/launched.err"
rc=$?
check "convert under a launcher: exit 2, one process named as the fix (exit $rc)" bash -c \
  "[ $rc -eq 2 ] && grep -q 'coc convert runs in one process, not in each of 2 ranks' '$TMP/launched.err' && [ ! -e '$TMP/x8' ]"
finish
