#!/usr/bin/env bash
# coc-test-timeout: 900
# The main job on its built-in default (2 ranks: tp 2, sequence parallel, N = 4, fortunes): per-iteration loss and
# elapsed time are printed, the loss falls from about ln(256) to below 3.0, and a sample is generated.
source "$(dirname "$0")/common.bash"
timeout 800 "$LAUNCH" -n 2 -- "$COC" train --log-interval 10 >"$TMP/out" 2>"$TMP/err"
rc=$?
tail -n 12 "$TMP/out"
check "exit status 0 (got $rc)" test "$rc" -eq 0
check "configuration line" grep -q "tp 2 × dp 1, sequence parallel on, --coc-parallel-num 4" "$TMP/err"
check "per-iteration elapsed time" grep -q "elapsed time per iteration (ms)" "$TMP/out"
first=$(grep "^ iteration" "$TMP/out" | grep -m1 -o "loss [0-9.]*" | awk '{print $2}')
last=$(grep "^ iteration" "$TMP/out" | grep -o "loss [0-9.]*" | tail -1 | awk '{print $2}')
check "first logged loss $first is near ln(256) or below (< 5.6)" awk -v l="$first" 'BEGIN{exit !(l < 5.6)}'
check "final loss $last < 3.0" awk -v l="$last" 'BEGIN{exit !(l < 3.0)}'
check "sample printed" grep -q -- "--- sample ---" "$TMP/out"
finish
