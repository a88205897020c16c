#!/usr/bin/env bash
# coc-test-timeout: 400
# Real data: a SentencePiece model trained here with Debian's spm_train on the default text trains with coc, the
# loss falls and the sample is decoded text; coc preprocess writes Megatron's .bin/.idx, checked by an independent
# numpy parser of the documented layout against spm_encode's ids; a blend of prefixes trains; a run on the
# preprocessed prefix with --split logs
# the validation loss in Megatron's format at --eval-interval, equal to a recomputation from the saved checkpoint
# (--skip-train) and the same on every parallel layout; bad inputs are one clear line each.
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3  # Debian's python3-numpy (scripts/setup)
F=/usr/share/games/fortunes
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 4 --no-progress)

spm_train --input="$F/fortunes,$F/computers,$F/science" --model_prefix="$TMP/sp" --vocab_size=600 --model_type=bpe \
  --character_coverage=1.0 --minloglevel=2 >"$TMP/spm.log" 2>&1
check "spm_train wrote a model" test -s "$TMP/sp.model"
SP=(--tokenizer-type SentencePieceTokenizer --tokenizer-model "$TMP/sp.model")

# 1. The tokenizer trains on the default text.
timeout 200 "$LAUNCH" -n 2 -- "$COC" train "${SP[@]}" "${SMALL[@]}" --train-iters 20 --lr 3e-3 --sample-length 12 \
  --sample-prompt "The " >"$TMP/sp.out" 2>"$TMP/sp.err"
check "SentencePiece run trains" grep -q "trained 20 iterations" "$TMP/sp.out"
check "the loss falls" $PY -c "
import re, sys
l = [float(x) for x in re.findall(r'\| loss ([0-9.]+)', open('$TMP/sp.out').read())]
print('losses', l[0], '->', l[-1]); sys.exit(0 if len(l) == 20 and l[-1] < l[0] - 0.5 else 1)"
check "the sample is decoded text (no byte escapes)" $PY -c "
t = open('$TMP/sp.out').read().split('--- sample ---\n')[1].split('\n-----')[0]
print(repr(t)); import sys; sys.exit(0 if t.startswith('The ') and len(t) > 8 and '\\\\x' not in t else 1)"

# 2. coc preprocess: JSON lines (one fortune per line, newlines folded so spm_encode sees one document per line).
$PY - "$F/fortunes" "$F/computers" >"$TMP/f.jsonl" <<'PY'
import json, sys
for path in sys.argv[1:]:
    for doc in open(path, encoding="utf-8", errors="replace").read().split("\n%\n"):
        doc = " ".join(doc.split())
        if doc:
            print(json.dumps({"text": doc}))
PY
"$COC" preprocess --input "$TMP/f.jsonl" --json-keys text --output-prefix "$TMP/f" "${SP[@]}" --append-eod \
  --workers 2 --log-interval 100 >"$TMP/pre.out" 2>&1
check "preprocess wrote PREFIX_text_document.bin/.idx" test -s "$TMP/f_text_document.bin" -a -s "$TMP/f_text_document.idx"
$PY -c "import json; [print(json.loads(l)['text']) for l in open('$TMP/f.jsonl')]" >"$TMP/f.txt"
spm_encode --model="$TMP/sp.model" --output_format=id <"$TMP/f.txt" >"$TMP/f.ids"
check "the .idx layout is Megatron's and the tokens are the tokenizer's output + eod" $PY - "$TMP/f_text_document" \
  "$TMP/f.ids" <<'PY'
import struct, sys
import numpy as np
prefix, ids_file = sys.argv[1], sys.argv[2]
raw = open(prefix + ".idx", "rb").read()
assert raw[:9] == b"MMIDIDX\x00\x00", raw[:9]
version, = struct.unpack("<Q", raw[9:17]); assert version == 1
code = raw[17]; assert code == 8, f"dtype code {code}: a 600-token vocabulary is uint16 (8)"
seqs, docs = struct.unpack("<QQ", raw[18:34])
off = 34
lengths = np.frombuffer(raw, np.int32, seqs, off); off += 4 * seqs
pointers = np.frombuffer(raw, np.int64, seqs, off); off += 8 * seqs
doc_idx = np.frombuffer(raw, np.int64, docs, off); off += 8 * docs
assert off == len(raw), (off, len(raw))
assert (doc_idx == np.arange(seqs + 1)).all(), "one sequence per document"
assert (pointers == np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * 2)])).all()
tokens = np.fromfile(prefix + ".bin", np.uint16)
assert tokens.size == lengths.sum()
expected = [[int(x) for x in line.split()] + [2] for line in open(ids_file)]  # + eos (</s> = 2)
assert len(expected) == seqs, (len(expected), seqs)
for i, e in enumerate(expected):
    got = tokens[pointers[i] // 2: pointers[i] // 2 + lengths[i]].tolist()
    assert got == e, (i, got[:10], e[:10])
print(f"{seqs} documents, {tokens.size} tokens: layout and tokens as expected")
PY

# 3. Training on the prefix with a validation split: Megatron's validation lines at --eval-interval.
P=(--data-path "$TMP/f_text_document" --split 90,10,0 --eval-iters 2)
timeout 200 "$LAUNCH" -n 2 -- "$COC" train "${SP[@]}" "${SMALL[@]}" "${P[@]}" --eval-interval 3 --train-iters 6 \
  --sample-length 0 --save "$TMP/ck" >"$TMP/eval.out" 2>&1
check "validation loss logged at iterations 3 and 6 in Megatron's format" bash -c "
  grep -c '^ validation loss at iteration [36] | lm loss value: [0-9.]*E[+-][0-9]* | lm loss PPL: [0-9.]*E[+-][0-9]* | $' \
  '$TMP/eval.out' | grep -qx 2"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SP[@]}" "${SMALL[@]}" "${P[@]}" --load "$TMP/ck" --skip-train \
  --sample-length 0 >"$TMP/recompute.out" 2>&1
# The periodic evaluation at the last iteration, the one after training and --skip-train's (Megatron's "on
# validation set" line) see the same batches and the same weights.
v6=$(sed -n 's/^ validation loss at iteration 6 | \(lm loss value: .*\)$/\1/p' "$TMP/eval.out")
check "the evaluation after training is the one at iteration 6" \
  grep -qxF " validation loss at iteration 6 on validation set | $v6" "$TMP/eval.out"
check "the validation loss equals its recomputation from the checkpoint (--skip-train)" \
  grep -qxF " validation loss at iteration 6 on validation set | $v6" "$TMP/recompute.out"
check "no test split (--split 90,10,0): the test set is skipped with a note" bash -c "
  grep -q 'note: no test split (--split 90,10,0; 0 test tokens, .*): the evaluation on the test set is skipped' \
  '$TMP/recompute.out' &&
  ! grep -q 'on test set' '$TMP/recompute.out' '$TMP/eval.out'"
# The same evaluation (the initial model, identical for any tp) on three layouts.
for layout in "1 1" "2 1" "2 2"; do
  set -- $layout
  timeout 120 "$LAUNCH" -n "$1" -- "$COC" train "${SP[@]}" "${SMALL[@]}" "${P[@]}" --skip-train --sample-length 0 \
    --tensor-model-parallel-size "$2" >"$TMP/layout$1$2.out" 2>&1
done
# Context parallelism: each cp rank evaluates its zig-zag positions, and the mean runs over dp × cp.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SP[@]}" "${SMALL[@]}" "${P[@]}" --skip-train --sample-length 0 \
  --context-parallel-size 2 >"$TMP/layoutcp.out" 2>&1
check "validation loss agrees on tp1 / tp1 dp2 / tp2 / cp2" $PY -c "
import re, sys
v = [float(re.search(r'lm loss value: (\S+)', open('$TMP/layout' + s + '.out').read()).group(1))
     for s in ('11', '21', '22', 'cp')]
print(v); sys.exit(0 if max(v) - min(v) <= 1e-4 * abs(v[0]) else 1)"

# Megatron's blend, as separate words.
timeout 120 "$LAUNCH" -n 1 -- "$COC" train "${SP[@]}" "${SMALL[@]}" --data-path 0.3 "$TMP/f_text_document" 0.7 \
  "$TMP/f" --train-iters 1 --sample-length 0 >"$TMP/blend.out" 2>&1
check "a weighted blend of two prefixes trains" grep -q "0.300 × .*0.700 × " "$TMP/blend.out"

# 4. Bad input.
expect_error missing_tokenizer_model "--tokenizer-model $TMP/none.model: no such file" 2 -- train \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$TMP/none.model" --train-iters 1
cp "$TMP/f_text_document.bin" "$TMP/g_text_document.bin"
expect_error prefix_without_idx "g_text_document.idx does not exist" 2 -- train --data-path "$TMP/g_text_document" \
  "${SP[@]}" --train-iters 1
cp "$TMP/f_text_document.bin" "$TMP/h_text_document.bin"
$PY -c "b = bytearray(open('$TMP/f_text_document.idx','rb').read()); b[0] = 0x58; open('$TMP/h_text_document.idx','wb').write(b)"
expect_error corrupt_idx "h_text_document.idx is not a valid Megatron index \(bad magic" 2 -- train \
  --data-path "$TMP/h_text_document" "${SP[@]}" --train-iters 1
expect_error gqa_tp "--num-query-groups 1 is not divisible by --tensor-model-parallel-size 2" 2 -- train \
  --group-query-attention --num-query-groups 1 --tensor-model-parallel-size 2 --train-iters 1
expect_error eval_without_split "needs validation data" 2 -- train --eval-interval 2 --eval-iters 1 --train-iters 1
finish
