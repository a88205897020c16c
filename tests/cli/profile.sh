#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc train --profile` on 2 ranks: one merged trace that passes the strict trace-event check of
# tests/cli/profile_validate.py (Perfetto importer rules; no offline Perfetto importer is available), with three
# ProfilerSteps per rank, Overlap Analysis lanes equal to their recomputation (and to `coc analyze` when it reads
# the file), CoC GEMM events matching the -v GEMM timer within 2%, the path and a summary line per rank logged.
# Bad --profile values give one clear error line.
source "$(dirname "$0")/common.bash"
PROF="$TMP/prof"
# Two timers of the same GEMMs agree within 2% only if the rank is not descheduled between them; on a loaded
# 2-core CI machine that can happen once, so a failed validation is retried once with a fresh run.
for attempt in 1 2; do
  rm -rf "$PROF"
  timeout 300 "$LAUNCH" -n 2 -- "$COC" train --train-iters 6 --profile --profile-step-start 2 --profile-step-end 5 \
    --profile-level level1 --profile-dir "$PROF" -v --no-progress --sample-length 0 >"$TMP/out" 2>"$TMP/err"
  rc=$?
  trace=$(ls "$PROF"/coc_trace_*.json 2>/dev/null | head -1)
  if [ $rc -eq 0 ] && [ -n "$trace" ] &&
     python3 "$ROOT/tests/cli/profile_validate.py" "$trace" 2 3 "$TMP/err" >"$TMP/validate" 2>&1; then
    ok=0; break
  fi
  ok=1
  echo "    attempt $attempt failed validation:"; sed 's/^/      /' "$TMP/validate" 2>/dev/null | tail -3
done
check "profiled run exits 0 (got $rc)" test "$rc" -eq 0
[ $rc -eq 0 ] || tail -20 "$TMP/err"
check "one trace file, no temporary left" test "$(ls "$PROF" | wc -l)" -eq 1 -a -n "$trace"
check "the path is logged" grep -q "profile: trace written to $trace" "$TMP/err"
check "a summary line per rank" test "$(grep -c 'profile: 3 steps, .*computing.*not overlapped.*free' "$TMP/err")" -eq 2
grep "profile:" "$TMP/err" | sed 's/^/    /'
sed 's/^/    /' "$TMP/validate"
check "trace validates (Perfetto importer rules, lanes, GEMM time)" test "$ok" -eq 0

# `coc analyze` reads the same file: its per-rank totals must equal the lanes written into it.
if "$COC" analyze --help >/dev/null 2>&1 && "$COC" analyze -q --json "$TMP/analyze.json" "$trace" >/dev/null 2>"$TMP/analyze.err"; then
  python3 - "$trace" "$TMP/analyze.json" >"$TMP/cmp" 2>&1 <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
lanes = {}
for e in doc["traceEvents"]:
    if e.get("cat") == "overlap_analysis":
        r = e["pid"] - 1000000
        lanes.setdefault(r, {}).setdefault(e["name"], 0)
        lanes[r][e["name"]] += round(e["dur"] * 1000)
rep = json.load(open(sys.argv[2]))
key = {"computing": "Computing", "communication": "Communication", "exposed": "Communication(Not Overlapped)", "free": "Free"}
bad = 0
for rr in rep["ranks"]:
    tot = rr["total"]
    for k, lane in key.items():
        got = tot.get(k + "_ns")
        want = lanes[rr["rank"]].get(lane, 0)
        print(f"rank {rr['rank']} {lane}: analyze {got} ns, lanes {want} ns")
        bad += got != want
sys.exit(1 if bad else 0)
PY
  cmp_rc=$?
  sed 's/^/    /' "$TMP/cmp"
  check "coc analyze totals equal the Overlap Analysis lanes" test "$cmp_rc" -eq 0
else
  echo "skip coc analyze comparison: 'coc analyze --json' is not available or failed: $(head -c 300 "$TMP/analyze.err" 2>/dev/null)"
fi

# Bad values: one line, exit 2, before any training.
expect_error end_before_start "--profile-step-end 2 must be greater than --profile-step-start 3" 2 -- \
  train --train-iters 4 --profile --profile-step-start 3 --profile-step-end 2
expect_error rank_out_of_range "--profile-ranks 5: rank out of range for a world of 2 ranks" 2 -- \
  train --train-iters 4 --profile --profile-ranks 5
expect_error bad_level "--profile-level 'level9' is not a level" 2 -- train --train-iters 4 --profile --profile-level level9
expect_error window_past_the_run "--profile-step-start 9 is not below --train-iters 4" 2 -- \
  train --train-iters 4 --profile --profile-step-start 9
expect_error window_without_profile "--profile-step-start is given but --profile is not" 2 -- \
  train --train-iters 4 --profile-step-start 1
touch "$TMP/a_file"
expect_error unwritable_dir "--profile-dir $TMP/a_file/x: cannot create the directory" 2 -- \
  train --train-iters 4 --profile --profile-dir "$TMP/a_file/x"
finish
