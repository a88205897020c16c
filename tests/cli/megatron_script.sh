#!/usr/bin/env bash
# coc-test-timeout: 240
# A MindSpeed-LLM LLaMA-2 pretrain script's argument list (examples/mcore/llama2/pretrain_llama2_7b_ptd.sh, written
# out here with its flags in their order; only the sizes and the paths changed) runs unchanged under
# scripts/launch on 2 ranks: it trains, evaluates at --eval-interval, saves, prints one note for the flags that
# restate coc and one per mapped flag, and resumes with --no-load-optim (a fresh optimizer and learning-rate
# schedule). So does the Mixtral script's list. --exit-interval stops and saves; --finetune loads the weights and
# starts at iteration 0 (src/cli/train_megatron_flags.h).
source "$(dirname "$0")/common.bash"
F=/usr/share/games/fortunes

spm_train --input="$F/fortunes" --model_prefix="$TMP/sp" --vocab_size=400 --model_type=bpe --character_coverage=1.0 \
  --minloglevel=2 >"$TMP/spm.log" 2>&1
check "spm_train wrote a model" test -s "$TMP/sp.model"
mkdir -p "$TMP/ckpt"

script_args() {  # script_args TRAIN_ITERS: the script's argument list
  GPT_ARGS=(
    --use-mcore-models --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel
    --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4
    --tokenizer-type Llama2Tokenizer --tokenizer-model "$TMP/sp.model"
    --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4
    --make-vocab-size-divisible-by 1 --lr 1.25e-3 --train-iters "$1" --lr-decay-style cosine
    --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0 --init-method-std 0.01
    --hidden-dropout 0.0 --position-embedding-type rope --normalization RMSNorm --use-fused-rmsnorm --swiglu
    --use-flash-attn --no-masked-softmax-fusion --attention-softmax-in-fp32 --min-lr 1.25e-4 --weight-decay 1e-1
    --lr-warmup-fraction 0.01 --clip-grad 1.0 --adam-beta1 0.9 --initial-loss-scale 65536 --adam-beta2 0.95
    --no-gradient-accumulation-fusion --no-load-optim --no-load-rng --use-distributed-optimizer
    --use-fused-swiglu --use-fused-rotary-pos-emb --overlap-grad-reduce)
  DATA_ARGS=(--data-path "$F/fortunes" --split 949,50,1)
  OUTPUT_ARGS=(--log-interval 1 --save-interval 10000 --eval-interval 3 --eval-iters 1)
  echo "${GPT_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" --distributed-backend nccl --load "$TMP/ckpt" \
    --save "$TMP/ckpt"
}
# The paths hold no spaces ($TMP is mktemp's), so the words split as the script's $GPT_ARGS do.
# shellcheck disable=SC2046
timeout 120 "$LAUNCH" -n 2 -- "$COC" train $(script_args 6) --sample-length 0 --no-progress \
  >"$TMP/run.out" 2>"$TMP/run.err"
rc=$?
check "the LLaMA-2 script's argument list runs (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$TMP/run.err"
check "six iterations logged" test "$(grep -c '^ iteration' "$TMP/run.out")" -eq 6
check "validation at iteration 3 and 6" test "$(grep -c '^ validation loss at iteration [36] | ' "$TMP/run.out")" -eq 2
# The script's --split 949,50,1 leaves the test part less than one sequence of this small corpus: a note, no error.
check "and after training on the validation set (Megatron's pretrain); the tiny test part is skipped with a note" \
  bash -c "grep -q '^ validation loss at iteration 6 on validation set | lm loss value: ' '$TMP/run.out' &&
  grep -q 'note: no test split (--split 949,50,1; [0-9]* test tokens, fewer than one sequence of 32 + 1)' \
  '$TMP/run.err'"
check "one note lists the restating flags" grep -q "note: accepted, restating what coc always does.*--use-mcore-models.*--normalization RMSNorm.*--swiglu.*--distributed-backend nccl" "$TMP/run.err"
check "Llama2Tokenizer is SentencePiece" grep -q "note: --tokenizer-type Llama2Tokenizer: coc's SentencePieceTokenizer" "$TMP/run.err"
check "--use-distributed-optimizer is the optim strategy" grep -q "note: --use-distributed-optimizer: --data-parallel-sharding-strategy optim" "$TMP/run.err"
check "the checkpoint is at iteration 6" grep -qx 6 "$TMP/ckpt/latest_checkpointed_iteration.txt"

# Resume with the same list and more iterations: --no-load-optim restarts the optimizer and the schedule (Megatron
# loads its scheduler with the optimizer), so the first resumed iteration runs at the warmup's start, lr 0.
# shellcheck disable=SC2046
timeout 120 "$LAUNCH" -n 2 -- "$COC" train $(script_args 8) --sample-length 0 --no-progress \
  >"$TMP/resume.out" 2>"$TMP/resume.err"
check "the script resumes (exit $?)" grep -q "resumed from $TMP/ckpt at iteration 6, with a fresh optimizer and learning-rate schedule (--no-load-optim)" "$TMP/resume.err"
check "iteration 7 runs at lr 0 (the schedule restarted)" grep -q "iteration        7/       8 | loss [0-9.]* | lr 0.000E+00" "$TMP/resume.out"

# MindSpeed-LLM's Mixtral list (examples/mcore/mixtral/pretrain_mixtral_8x7b_ptd.sh: its MOE_ARGS and GPT_ARGS in
# their order, shrunk to 4 experts over ep 2, the split scaled to the small corpus): the distributed optimizer shards
# the dense weights' optimizer state over dp and the experts' over their expert-dp ranks (the optim strategy).
MIXTRAL=(--num-experts 4 --expert-model-parallel-size 2 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 0.02 --moe-permutation-async-comm
  --use-mcore-models --disable-bias-linear --seq-length 32 --max-position-embeddings 32 --num-layers 2
  --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --init-method-std 0.01 --attention-dropout 0.0
  --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
  --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --vocab-size 400
  --rotary-base 1e6 --no-masked-softmax-fusion --use-fused-rotary-pos-emb --use-flash-attn --use-fused-swiglu
  --use-fused-rmsnorm --no-check-for-nan-in-loss-and-grad --overlap-grad-reduce --overlap-param-gather --use-mc2
  --make-vocab-size-divisible-by 1 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
  --sequence-parallel --use-distributed-optimizer --context-parallel-size 1 --context-parallel-algo megatron_cp_algo
  --tokenizer-type Llama2Tokenizer --tokenizer-model "$TMP/sp.model" --load "$TMP/mx" --save "$TMP/mx"
  --micro-batch-size 1 --global-batch-size 4 --lr 1e-5 --train-iters 4 --lr-decay-iters 3 --lr-decay-style cosine
  --min-lr 1.0e-6 --weight-decay 0.1 --lr-warmup-iters 2 --clip-grad 1.0 --no-load-optim --no-load-rng
  --no-shared-storage --data-path "$F/fortunes" --split 990,8,2 --log-interval 1 --save-interval 2000
  --eval-interval 5001 --eval-iters 100 --distributed-backend nccl --bf16)
mkdir -p "$TMP/mx"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${MIXTRAL[@]}" --sample-length 0 --no-progress >"$TMP/mx.out" 2>"$TMP/mx.err"
rc=$?
check "the Mixtral script's argument list runs (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -3 "$TMP/mx.err"
check "four MoE iterations with the load-balancing loss" test "$(grep -c '^ iteration.*load_balancing_loss' "$TMP/mx.out")" -eq 4
check "the distributed optimizer's note names the experts' ranks" grep -q "note: --use-distributed-optimizer: --data-parallel-sharding-strategy optim (ZeRO-1: AdamW's state sharded over the data-parallel ranks, a MoE model's experts over their expert-data-parallel ranks" "$TMP/mx.err"
check "the Mixtral run shards with optim" grep -q "sharding: optim over dp × cp = 2" "$TMP/mx.err"

# --exit-interval: stop after iteration 2 and save there; --finetune then loads those weights at iteration 0.
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --train-iters 6 --exit-interval 2 --save "$TMP/exit" \
  --split 90,10,0 --eval-iters 1 >"$TMP/exit.out" 2>"$TMP/exit.err"
check "--exit-interval 2 stops after iteration 2" test "$(grep -c '^ iteration' "$TMP/exit.out")" -eq 2
check "... without the evaluation after training (Megatron exits inside train())" \
  bash -c "! grep -q 'validation loss' '$TMP/exit.out'"
check "... and saves there" grep -qx 2 "$TMP/exit/latest_checkpointed_iteration.txt"
check "a no_shard run logs each rank's memory too" test "$(grep -c 'memory per rank: parameters .* peak RSS' "$TMP/exit.err")" -eq 2
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --train-iters 2 --load "$TMP/exit" --finetune \
  >"$TMP/ft.out" 2>"$TMP/ft.err"
check "--finetune starts at iteration 0" test "$(grep -c '^ iteration' "$TMP/ft.out")" -eq 2
check "--finetune says so" grep -q "fine-tuning the weights of $TMP/exit at iteration 2 from iteration 0" "$TMP/ft.err"
finish
