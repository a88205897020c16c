#!/usr/bin/env bash
# coc-test-timeout: 600
# --coc-tuning-cache FILE (include/coc/overlap/tuning_cache.h): the first run of --coc-parallel-num auto times its
# candidates and stores the choices; a second run with the same file takes them without timing and makes the same
# choices; an entry of another MPI library is timed again (and kept beside the new one); a corrupt file is refused
# with one line before training. COC_TEST_AUTO_TIMED=1 makes auto time on one node (where it would choose serial
# without timing), so that this runs on one machine.
source "$(dirname "$0")/common.bash"
CACHE="$TMP/tuning.json"
export COC_TEST_AUTO_TIMED=1
train() {  # train OUT_PREFIX [FLAGS...]: a 2-rank tp 2 run with auto and the cache, verbose
  local out="$1"; shift
  timeout 300 "$LAUNCH" -n 2 -- "$COC" train --train-iters 3 --tp 2 --sequence-parallel --coc-parallel-num auto \
    --coc-tuning-cache "$CACHE" -v --no-progress --sample-length 0 "$@" >"$out.out" 2>"$out.err"
}
# "op m=.. n=.. k per rank=.. tp=..: CHOICE": the choice of every shape, without the reason.
choices() { grep -o "coc auto [a-z_0-9]*[^:]*: [^(]*" "$1" | sed 's/ *$//' | sort; }

# Both runs are profiled: the first's summary shows the steps without the timing apart, the second's has none.
train "$TMP/first" --profile --profile-dir "$TMP/prof1"; rc=$?
check "first run exits 0 (got $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$TMP/first.err"
check "first run times its candidates" grep -q "coc auto .*(timed: " "$TMP/first.err"
check "the cache file was written" test -s "$CACHE"
check "no temporary file is left beside it" test "$(ls "$TMP" | grep -c 'tuning.json.tmp')" -eq 0
choices "$TMP/first.err" | sed 's/^/    first: /'

check "first run's profile: a line per rank without the timing step" \
  test "$(grep -c 'profile: without ProfilerStep#0 (--coc-parallel-num auto timed its candidates there, once per shape): 2 steps' "$TMP/first.err")" -eq 2
grep "profile:" "$TMP/first.err" | sed 's/^/    /'

train "$TMP/second" --profile --profile-dir "$TMP/prof2"; rc=$?
check "second run exits 0 (got $rc)" test $rc -eq 0
check "second run times nothing" test "$(grep -c '(timed: ' "$TMP/second.err")" -eq 0
check "second run's profile: no step left out" test "$(grep -c 'profile: without' "$TMP/second.err")" -eq 0
check "second run takes its choices from the cache" grep -q "coc auto .*(from the tuning cache $CACHE" "$TMP/second.err"
check "same choices as the first run" test "$(choices "$TMP/first.err")" = "$(choices "$TMP/second.err")"
grep "elapsed time per iteration" "$TMP/first.out" "$TMP/second.out" | sed 's/^/    /'

# A foreign entry (another MPI library): timed again, and the file then holds both.
n_before=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["entries"]))' "$CACHE")
/usr/bin/python3 - "$CACHE" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["entries"]:
    e["mpi_library"] = "Foreign MPI 9.9"
json.dump(d, open(sys.argv[1], "w"))
PY
train "$TMP/third"; rc=$?
check "run with foreign entries exits 0 (got $rc)" test $rc -eq 0
check "foreign entries are timed again" grep -q "coc auto .*(timed: " "$TMP/third.err"
check "foreign entries are not used" test "$(grep -c 'from the tuning cache' "$TMP/third.err")" -eq 0
n_after=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["entries"]))' "$CACHE")
check "the foreign entries stay beside the new ones ($n_before -> $n_after)" test "$n_after" -eq $((2 * n_before))

# Corrupt or unusable files: one line, exit 2, before training.
printf '{"format": "coc-tuning-cache", "version": 1, "entries": [' >"$TMP/corrupt.json"
expect_error corrupt_file "--coc-tuning-cache $TMP/corrupt.json: not JSON at byte [0-9]+.*delete it" 2 -- \
  train --train-iters 2 --tp 2 --coc-parallel-num auto --coc-tuning-cache "$TMP/corrupt.json"
check "corrupt file: exit code 2" test "$last_rc" -eq 2
echo '{"format": "something else"}' >"$TMP/other.json"
expect_error other_format "--coc-tuning-cache $TMP/other.json: not a \"format\": \"coc-tuning-cache\" object" 2 -- \
  train --train-iters 2 --tp 2 --coc-parallel-num auto --coc-tuning-cache "$TMP/other.json"
echo '{"format": "coc-tuning-cache", "version": 1, "entries": [{"op": "matmul_all_reduce"}]}' >"$TMP/entry.json"
expect_error bad_entry "--coc-tuning-cache $TMP/entry.json: entry 0 has no integer \"m\"" 2 -- \
  train --train-iters 2 --tp 2 --coc-parallel-num auto --coc-tuning-cache "$TMP/entry.json"
expect_error directory "--coc-tuning-cache $TMP: is a directory" 2 -- \
  train --train-iters 2 --tp 2 --coc-parallel-num auto --coc-tuning-cache "$TMP"
expect_error missing_folder "--coc-tuning-cache $TMP/no/such.json: is in a folder that does not exist" 2 -- \
  train --train-iters 2 --tp 2 --coc-parallel-num auto --coc-tuning-cache "$TMP/no/such.json"
finish
