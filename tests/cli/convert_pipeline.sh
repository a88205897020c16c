#!/usr/bin/env bash
# coc-test-timeout: 300
# coc convert and pipelined checkpoints (issue 34; docs/pipeline.md, "Checkpoints"): a Hugging Face model converted
# at --target-pipeline-parallel-size 2 (one shard per stage) loads in coc train at pp 2 × V 2 and trains bitwise as
# the pp 1 conversion does at pp 1; exported back from pp 2 (with tp 2 too) it equals the original bit for bit. A
# checkpoint trained at pp 2 × V 2 exports to Hugging Face (the stages merged), and re-cut by --loader coc --saver
# coc at pp 4 and pp 1 it exports the same bits and resumes at that pp bitwise. Bad input is one clear line each:
# a P above the layers or not dividing them, a missing stage shard, a target size with --saver hf, another tp from
# coc, --save-dir equal to --load-dir.
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3  # Debian's python3-numpy (scripts/setup)
H="$ROOT/tests/cli/hf_llama.py"
C=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --ffn-hidden-size 96 --seq-length 16 --sample-length 0 --no-progress -v --tp 1 --deterministic --train-iters 4)
source "$(dirname "$0")/pipeline_common.bash"
cv() { "$COC" convert "$@" >"$TMP/convert.out" 2>&1 || cat "$TMP/convert.out"; }
$PY "$H" make "$TMP/hf" --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 256

# Hugging Face -> coc at pp 2: one shard per stage, loading at pp 2 (V 2) as the pp 1 conversion loads at pp 1.
cv --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c1"
cv --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c2" --target-pipeline-parallel-size 2
check "hf -> coc at pp 2 writes each stage's shard" test -s "$TMP/c2/iter_0000000/mp_rank_00_dp_001.ckpt"
check "convert prints the pp to fine-tune at" grep -q \
  "coc train --load $TMP/c2 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2" "$TMP/convert.out"
losses 1 --load "$TMP/c1" > "$TMP/whole"
losses 2 --load "$TMP/c2" --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
  --save "$TMP/ft" --save-interval 2 > "$TMP/pp"
check "the pp 2 conversion trains at pp 2 x V 2 bitwise as the pp 1 one at pp 1 ($(wc -l < "$TMP/whole") losses)" \
  bash -c "[ -s '$TMP/whole' ] && cmp -s '$TMP/whole' '$TMP/pp'"
cv --loader coc --saver hf --load-dir "$TMP/c2" --save-dir "$TMP/back2"
check "coc (pp 2) -> hf equals the original bit for bit" $PY "$H" same "$TMP/hf" "$TMP/back2"
cv --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/c22" --target-tensor-parallel-size 2 \
  --target-pipeline-parallel-size 2
cv --loader coc --saver hf --load-dir "$TMP/c22" --save-dir "$TMP/back22"
check "coc (tp 2 x pp 2) -> hf equals the original bit for bit" $PY "$H" same "$TMP/hf" "$TMP/back22"

# A trained pp 2 × V 2 checkpoint (iteration 2; the run saved 4 too): exported with its stages merged, and re-cut at
# pp 4 and pp 1, which export the same bits and resume at that pp bitwise (the Adam moments and the step move along).
echo 2 > "$TMP/ft/latest_checkpointed_iteration.txt"
cv --loader coc --saver hf --load-dir "$TMP/ft" --save-dir "$TMP/ft_hf"
check "coc (pp 2 x V 2, trained) -> hf" test -s "$TMP/ft_hf/model.safetensors"
for p in 4 1; do
  cv --loader coc --saver coc --load-dir "$TMP/ft" --save-dir "$TMP/ft$p" --target-pipeline-parallel-size $p
  cv --loader coc --saver hf --load-dir "$TMP/ft$p" --save-dir "$TMP/ft${p}_hf"
  check "re-cut at pp $p, it exports the same bits" $PY "$H" same "$TMP/ft_hf" "$TMP/ft${p}_hf"
  losses $p --load "$TMP/ft$p" --pipeline-model-parallel-size $p > "$TMP/resumed"
  check "re-cut at pp $p, it resumes at pp $p bitwise ($(wc -l < "$TMP/resumed") losses)" bash -c \
    "[ -s '$TMP/resumed' ] && tail -2 '$TMP/whole' | cmp -s - '$TMP/resumed'"
done
check "pp 4 wrote four stage shards" test -s "$TMP/ft4/iter_0000002/mp_rank_00_dp_003.ckpt"

# Bad input: one clear line each.
expect_error pp_above_layers "--target-pipeline-parallel-size 8 exceeds the model's 4 layers.*pass at most 4" 0 -- \
  convert --loader hf --saver coc --load-dir "$TMP/hf" --save-dir "$TMP/x1" --target-pipeline-parallel-size 8
expect_error pp_not_dividing "--target-pipeline-parallel-size 3 does not divide the model's 4 layers" 0 -- \
  convert --loader coc --saver coc --load-dir "$TMP/ft" --save-dir "$TMP/x2" --target-pipeline-parallel-size 3
cp -r "$TMP/c2" "$TMP/nostage" && rm "$TMP/nostage/iter_0000000/mp_rank_00_dp_001.ckpt"
expect_error missing_stage \
  "mp_rank_00_dp_001.ckpt is missing: the checkpoint was saved with --pipeline-model-parallel-size 2 .*stage 1" 0 -- \
  convert --loader coc --saver hf --load-dir "$TMP/nostage" --save-dir "$TMP/x3"
expect_error missing_stage_coc "mp_rank_00_dp_001.ckpt is missing" 0 -- convert --loader coc --saver coc \
  --load-dir "$TMP/nostage" --save-dir "$TMP/x4" --target-pipeline-parallel-size 1
expect_error pp_to_hf "--target-pipeline-parallel-size 2 shapes a coc checkpoint \(--saver coc\)" 0 -- convert \
  --loader coc --saver hf --load-dir "$TMP/c2" --save-dir "$TMP/x5" --target-pipeline-parallel-size 2
expect_error tp_coc_to_coc "--target-tensor-parallel-size 2: --loader coc --saver coc re-cuts pipeline stages only" 0 \
  -- convert --loader coc --saver coc --load-dir "$TMP/c2" --save-dir "$TMP/x6" --target-tensor-parallel-size 2
expect_error same_dir "--save-dir $TMP/c2 is --load-dir" 0 -- convert --loader coc --saver coc --load-dir "$TMP/c2" \
  --save-dir "$TMP/c2" --force
finish
