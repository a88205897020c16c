#!/usr/bin/env bash
# coc-test-timeout: 120
# scripts/launch names a rank that dies without a word (kill -9, the OOM killer) or exits non-zero without a
# message: one line "launch: rank R (host H, pid P) was killed by signal 9 (KILL)", a non-zero exit, within 30 s,
# with --quiet (the default, which hides Open MPI's own notice). A coc error is not followed by such lines.
source "$(dirname "$0")/common.bash"
rank_var=OMPI_COMM_WORLD_RANK; [ "${COC_MPI:-openmpi}" = mpich ] && rank_var=PMI_RANK

# kill -9 of rank 1 of a training run.
start=$SECONDS
"$LAUNCH" -n 2 --quiet -- "$COC" train --train-iters 100000 --sample-length 0 --no-progress \
  >"$TMP/kill.out" 2>"$TMP/kill.err" &
job=$!
victim=""
for _ in $(seq 1 300); do
  for p in $(pgrep -f "coc train --train-iters 100000"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$rank_var=1"; then victim=$p; fi
  done
  [ -n "$victim" ] && grep -q "iteration" "$TMP/kill.out" && break
  sleep 0.1
done
check "found rank 1's process" test -n "$victim"
kill -9 "$victim"
timeout 30 tail --pid=$job -f /dev/null
wait $job
rc=$?
check "the job exits non-zero after kill -9 of rank 1 (got $rc)" test "$rc" -ne 0
check "the job ends within 30 s of the kill ($((SECONDS - start)) s in all)" test $((SECONDS - start)) -lt 60
check "one line names rank 1, its host, its pid and signal 9" \
  test "$(grep -c "^launch: rank 1 (host $(hostname), pid $victim) was killed by signal 9 (KILL)$" "$TMP/kill.err")" -eq 1
check "no other rank is named" test "$(grep -c '^launch: rank' "$TMP/kill.err")" -eq 1
sed 's/^/    /' "$TMP/kill.err" | head -3

# A rank that exits non-zero without a message.
cat >"$TMP/exit3.sh" <<SH
#!/usr/bin/env bash
[ "\$$rank_var" = 1 ] && exit 3
sleep 20
SH
chmod +x "$TMP/exit3.sh"
start=$SECONDS
timeout 60 "$LAUNCH" -n 2 -- "$TMP/exit3.sh" >/dev/null 2>"$TMP/exit3.err"
rc=$?
check "a silent non-zero exit fails the job (got $rc), well before rank 0's 20 s" test "$rc" -ne 0 -a $((SECONDS - start)) -lt 15
check "and is named in one line" \
  test "$(grep -c "^launch: rank 1 (host $(hostname), pid [0-9]*) exited with code 3 without a message$" "$TMP/exit3.err")" -eq 1

# A coc error speaks for itself: no launch line after it (one rank fails; a uniform error on every rank).
timeout 60 "$LAUNCH" -n 2 -- "$COC" env --fail-on-rank 1 >/dev/null 2>"$TMP/coc_err.err"
check "a coc error on one rank adds no launch line" bash -c "! grep -q '^launch: rank' '$TMP/coc_err.err'"
timeout 60 "$LAUNCH" -n 2 -- "$COC" train --tp 3 >/dev/null 2>"$TMP/uniform.err"
check "a uniform coc error adds no launch line" bash -c "! grep -q '^launch: rank' '$TMP/uniform.err'"
grep -q "coc: error:" "$TMP/uniform.err" || { echo "    (no coc error in the uniform case:)"; head -3 "$TMP/uniform.err"; }
finish
