#!/usr/bin/env bash
# coc-test-timeout: 300
# Checkpoints resume exactly: 3 iterations, save, resume to 6 prints the same losses as 6 straight iterations.
source "$(dirname "$0")/common.bash"
C=(--lr-warmup-iters 2 --lr-decay-iters 6 --sample-length 0 --no-progress --seq-length 64)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 6 >"$TMP/straight" 2>/dev/null
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 3 --save "$TMP/ck" >"$TMP/first" 2>/dev/null
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 6 --load "$TMP/ck" --save "$TMP/ck" \
  >"$TMP/resumed" 2>"$TMP/resumed.err"
losses() { grep -o "iteration *[0-9]*/ *[0-9]* | loss [0-9.]*" "$1" | sed 's/ \+/ /g'; }
check "checkpoint files written atomically (no .tmp left)" bash -c "ls '$TMP/ck/iter_0000003/' | grep -q mp_rank_00 && ! ls -R '$TMP/ck' | grep -q '\.tmp'"
check "latest_checkpointed_iteration.txt" grep -q 6 "$TMP/ck/latest_checkpointed_iteration.txt"
check "resumed message" grep -q "resumed from" "$TMP/resumed.err"
diff <(losses "$TMP/straight" | tail -3) <(losses "$TMP/resumed") && ok=1 || ok=0
losses "$TMP/straight"; echo "resumed:"; losses "$TMP/resumed"
check "iterations 4-6 identical after resume" test "$ok" -eq 1
finish
