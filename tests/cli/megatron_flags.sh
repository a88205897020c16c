#!/usr/bin/env bash
# coc-test-timeout: 240
# Megatron's script flags one by one (src/cli/train_megatron_flags.h, coc/model/optimizer.h): each
# --lr-decay-style's learning rates are Megatron's formulas; PretrainedFromHF reads a folder's tokenizer.model and
# refuses one with only tokenizer.json; the MoE names map onto coc's; values coc cannot honour are refused in one
# line naming each flag, its value and the reason; a mistyped flag (or --config key) gets "did you mean", the unknown
# flags are named with their values in order; --help has no {false} markers.
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3
F=/usr/share/games/fortunes
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress)

# 1. Each decay style: the logged learning rates against Megatron's OptimizerParamScheduler.get_lr.
lrs() {  # lrs NAME FLAGS...: the run's learning rates, one per line
  local name="$1"; shift
  timeout 60 "$LAUNCH" -n 1 -- "$COC" train "${SMALL[@]}" --train-iters 8 --lr 1e-3 --min-lr 1e-4 "$@" \
    --log-json "$TMP/$name.jsonl" >"$TMP/$name.out" 2>"$TMP/$name.err" || { echo "run $name failed"; tail -2 "$TMP/$name.err"; }
  $PY -c 'import json, sys; [print(r["lr"]) for r in map(json.loads, open(sys.argv[1])) if r["type"] == "iteration"]' \
    "$TMP/$name.jsonl"
}
megatron() {  # megatron STYLE WARMUP DECAY INIT WSD_ITERS WSD_STYLE: Megatron's get_lr for iterations 0..7
  $PY - "$@" <<'PY'
import math, sys
style, W, D, init, wsd, wsd_style = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
lr, mn = 1e-3, 1e-4
def get_lr(n):
    if W > 0 and n <= W: return init + (lr - init) * n / W
    if style == "constant": return lr
    if n > D: return mn
    if style == "inverse-square-root": return max(mn, lr * max(W, 1) ** 0.5 / max(n, 1) ** 0.5)
    r = (n - W) / (D - W)
    if style == "linear": c = 1 - r
    elif style == "cosine": c = 0.5 * (math.cos(math.pi * r) + 1)
    else:
        start = D - wsd
        if n <= start: c = 1.0
        else:
            q = (n - start) / wsd
            c = {"linear": 1 - q, "cosine": 0.5 * (math.cos(math.pi * q) + 1), "exponential": 2 * 0.5 ** q - 1,
                 "minus_sqrt": 1 - q ** 0.5}[wsd_style]
    return mn + c * (lr - mn)
for n in range(8): print(get_lr(n))
PY
}
same() {  # same A B: equal within float rounding, line by line
  $PY -c 'import sys; a, b = ([float(x) for x in s.split()] for s in sys.argv[1:3]); sys.exit(0 if len(a) == len(b) == 8 and all(abs(x - y) <= 1e-6 * max(abs(y), 1e-9) for x, y in zip(a, b)) else 1)' "$1" "$2" ||
    { echo "    coc: $(echo $1)"; echo "    Megatron: $(echo $2)"; return 1; }
}
check "--lr-decay-style linear" same "$(lrs linear --lr-decay-style linear --lr-warmup-iters 2)" "$(megatron linear 2 8 0 0 x)"
check "--lr-decay-style constant" same "$(lrs constant --lr-decay-style constant --lr-warmup-iters 2)" "$(megatron constant 2 8 0 0 x)"
check "--lr-decay-style inverse-square-root with --lr-decay-iters 6" \
  same "$(lrs isr --lr-decay-style inverse-square-root --lr-warmup-iters 2 --lr-decay-iters 6)" "$(megatron inverse-square-root 2 6 0 0 x)"
check "--lr-decay-style WSD (minus_sqrt over the last 3)" \
  same "$(lrs wsd --lr-decay-style WSD --lr-wsd-decay-iters 3 --lr-wsd-decay-style minus_sqrt --lr-warmup-iters 1)" "$(megatron WSD 1 8 0 3 minus_sqrt)"
check "--lr-warmup-fraction 0.25 and --lr-warmup-init 2e-4 (cosine)" \
  same "$(lrs frac --lr-warmup-fraction 0.25 --lr-warmup-init 2e-4)" "$(megatron cosine 2 8 2e-4 0 x)"
# Sample-based (global batch 4): warmup 6 samples = 1.5 iterations, decay 26 = 6.5; 33 samples = 8 iterations.
check "--lr-warmup-samples 6, --lr-decay-samples 26 (linear)" \
  same "$(lrs samples --lr-decay-style linear --lr-warmup-samples 6 --lr-decay-samples 26)" \
  "$(megatron linear 1.5 6.5 0 0 x)"
timeout 60 "$LAUNCH" -n 1 -- "$COC" train "${SMALL[@]}" --train-samples 33 >"$TMP/ts.out" 2>&1
check "--train-samples 33 at global batch 4 trains 8 iterations" test "$(grep -c '^ iteration' "$TMP/ts.out")" -eq 8
expect_error samples_and_iters "--train-samples 33 and --train-iters 8: pass only one of them" 2 -- train \
  --train-samples 33 --train-iters 8
timeout 60 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --train-iters 50 --exit-duration-in-mins 1e-6 >"$TMP/dur.out" 2>&1
check "--exit-duration-in-mins stops after the first iteration" test "$(grep -c '^ iteration' "$TMP/dur.out")" -eq 1
mkdir -p "$TMP/empty"
expect_error missing_ckpt "--load $TMP/empty: no latest_checkpointed_iteration.txt, and --exit-on-missing-checkpoint" 2 -- \
  train "${SMALL[@]}" --load "$TMP/empty" --exit-on-missing-checkpoint

# 2. Tokenizers by Megatron's and MindSpeed-LLM's names.
spm_train --input="$F/fortunes" --model_prefix="$TMP/sp" --vocab_size=300 --model_type=bpe --character_coverage=1.0 \
  --minloglevel=2 >"$TMP/spm.log" 2>&1
mkdir -p "$TMP/hf" "$TMP/fast"
cp "$TMP/sp.model" "$TMP/hf/tokenizer.model"
echo '{}' >"$TMP/fast/tokenizer.json"
timeout 60 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --train-iters 1 --tokenizer-type PretrainedFromHF \
  --tokenizer-name-or-path "$TMP/hf" --vocab-size 300 --padded-vocab-size 304 >"$TMP/hf.out" 2>"$TMP/hf.err"
check "PretrainedFromHF reads the folder's tokenizer.model; --padded-vocab-size pads" grep -q "tokenizer: SentencePieceTokenizer ($TMP/hf/tokenizer.model), vocabulary 300 (padded to 304)" "$TMP/hf.err"
expect_error hf_fast_only "--tokenizer-name-or-path $TMP/fast: no tokenizer.model there \(only tokenizer.json.*pass a folder with tokenizer.model" 2 -- \
  train --tokenizer-type PretrainedFromHF --tokenizer-name-or-path "$TMP/fast"
expect_error vocab_size "--vocab-size 32000: the tokenizer \(SentencePieceTokenizer\) has 300 tokens" 2 -- \
  train --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$TMP/sp.model" --vocab-size 32000 --train-iters 1

# 3. MoE: Megatron's dispatcher name is accepted, load balancing none is a zero aux loss, first-k-dense keeps layer 0
#    dense.
timeout 60 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --train-iters 1 --num-experts 4 --moe-router-topk 2 \
  --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type none --moe-grouped-gemm \
  --moe-permutation-async-comm --first-k-dense-replace 1 >"$TMP/moe.out" 2>"$TMP/moe.err"
check "the MoE flags run" grep -q "load_balancing_loss 0.000000E+00" "$TMP/moe.out"
check "--first-k-dense-replace 1: MoE from layer 1 on" grep -q "layers i with i % 1 == 0 and i >= 1" "$TMP/moe.err"
check "aux coefficient 0" grep -q "aux loss coeff 0" "$TMP/moe.err"

# 4. Values coc cannot honour: one line, each flag with its value and the reason.
expect_error refused "--normalization LayerNorm: coc implements RMSNorm only.*; --position-embedding-type learned_absolute: .*; --hidden-dropout 0.1: coc has no dropout yet" 2 -- \
  train --normalization LayerNorm --position-embedding-type learned_absolute --hidden-dropout 0.1
expect_error qkv_bias "--add-qkv-bias: coc's linear layers have no biases" 2 -- train --add-qkv-bias
expect_error kv_channels "--kv-channels 32: coc's head dimension is --hidden-size / --num-attention-heads = 16" 2 -- \
  train "${SMALL[@]}" --kv-channels 32
expect_error gpt2_bpe "--vocab-file vocab.json: coc has no GPT-2 BPE tokenizer.*; --merge-file merges.txt" 2 -- \
  train --vocab-file vocab.json --merge-file merges.txt
expect_error max_pos "--max-position-embeddings 16: below --seq-length 32" 2 -- train "${SMALL[@]}" \
  --max-position-embeddings 16
expect_error warmup_both "pass only one of them" 2 -- train --lr-warmup-fraction 0.1 --lr-warmup-iters 3
expect_error decay_style "--lr-decay-style exp: use linear, cosine, constant, inverse-square-root or WSD" 2 -- \
  train --lr-decay-style exp

# 5. Command-line manners.
expect_error did_you_mean "arguments were not expected: --foo 1, --tensor-model-paralel-size 2 \(did you mean --tensor-model-parallel-size\?\)" 2 -- \
  train --foo 1 --tensor-model-paralel-size 2 --lr 1e-3
printf 'tensor-model-paralel-size: 2\n' >"$TMP/typo.yaml"
expect_error yaml_did_you_mean "--config $TMP/typo.yaml: unknown key 'tensor-model-paralel-size' \(did you mean 'tensor-model-parallel-size'\?\)" 2 -- \
  train --config "$TMP/typo.yaml"
# A negated flag name as a config key stands for the inverse value, as on the command line.
for kv in "no-sequence-parallel: true/off" "no-sequence-parallel: false/on" "sequence-parallel: false/off"; do
  printf '%s\n' "${kv%/*}" >"$TMP/negated.yaml"
  timeout 60 "$LAUNCH" -n 2 -- "$COC" train --tp 2 --train-iters 1 --sample-length 0 --no-progress \
    --config "$TMP/negated.yaml" >"$TMP/negated.out" 2>&1
  check "config '${kv%/*}' leaves sequence parallelism ${kv#*/}" grep -q "sequence parallel ${kv#*/}" "$TMP/negated.out"
done
timeout 60 "$LAUNCH" -n 1 -- "$COC" train --help >"$TMP/help.out" 2>&1
check "--help lists the negated switches without {false}" bash -c "grep -q -- '--no-sequence-parallel' '$TMP/help.out' && ! grep -q '{false}\|{true}' '$TMP/help.out'"
finish
