#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc train --profile` on 2 ranks: one merged trace that passes the strict trace-event check of
# tests/cli/profile_validate.py (Perfetto importer rules; no offline Perfetto importer is available), with three
# ProfilerSteps per rank, Overlap Analysis lanes equal to their recomputation (and to `coc analyze` when it reads
# the file), CoC GEMM events matching the -v GEMM timer within 2%, the path and a summary line per rank logged.
# A level0 run records the same categories as level1 (every kernel, host work), and `coc analyze` explains its
# Free. Bad --profile values give one clear error line.
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
cross='profile: waiting for a later rank to post \(part of not overlapped, % of the steps\): '
cross+='rank 0 [0-9.]+%, rank 1 [0-9.]+%; computing [0-9.]+ ms \(rank [01]\) to [0-9.]+ ms \(rank [01]\), spread'
check "rank 0 logs the waits for a later rank and the compute balance" grep -Eq "$cross" "$TMP/err"
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
    # Waiting for a later rank (docs/analysis.md): known for a merged two-rank file, and part of the exposed time.
    wait = tot.get("late_wait_ns", -1)
    print(f"rank {rr['rank']} exposed while a later rank had not posted: {wait} ns of {tot['exposed_ns']} ns")
    bad += not (0 <= wait <= tot["exposed_ns"])
sys.exit(1 if bad else 0)
PY
  cmp_rc=$?
  sed 's/^/    /' "$TMP/cmp"
  check "coc analyze totals equal the Overlap Analysis lanes; its late-rank waits lie within the exposed time" \
    test "$cmp_rc" -eq 0
else
  echo "skip coc analyze comparison: 'coc analyze --json' is not available or failed: $(head -c 300 "$TMP/analyze.err" 2>/dev/null)"
fi

# An honest profile at every level (docs/profiling.md, "What is recorded"): level0 records every compute kernel
# (not only the GEMMs) and the host work, and a level only adds host-track detail, so the level0 trace holds the
# same compute, comm and host_work event names as the level1 one, and as many compute events of each name (the same
# model and steps run the same kernels). Counts, not the computing share: the share of two runs depends on what
# else the machine runs (it once moved by more than the 20 points this test allowed while the machine was busy).
PROF0="$TMP/prof0"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train --train-iters 6 --profile --profile-step-start 2 --profile-step-end 5 \
  --profile-level level0 --profile-dir "$PROF0" --no-progress --sample-length 0 >"$TMP/out0" 2>"$TMP/err0"
rc0=$?
trace0=$(ls "$PROF0"/coc_trace_*.json 2>/dev/null | head -1)
check "level0 profiled run exits 0 (got $rc0)" test "$rc0" -eq 0 -a -n "$trace0"
grep "profile: 3 steps" "$TMP/err0" | sed 's/^/    level0 /'
check "the summary splits free into host work and idle" grep -q "free .*% (host work .*%, idle .*%)" "$TMP/err0"
python3 - "$trace0" "$trace" >"$TMP/levels" 2>&1 <<'PY'
import json, sys
from collections import Counter
def load(path):
    names, counts = {}, Counter()
    doc = json.load(open(path))
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e["cat"] in ("compute", "comm", "host_work"):
            names.setdefault(e["cat"], set()).add(e["name"])
        if e["cat"] == "compute":
            counts[(e["pid"], e["name"])] += 1
    return names, counts
n0, c0 = load(sys.argv[1])
n1, c1 = load(sys.argv[2])
bad = 0
need = {"gemm", "attention_forward", "attention_backward", "rmsnorm_forward", "rmsnorm_backward", "rope",
        "swiglu_forward", "swiglu_backward", "vocab_ce_sum_exp", "vocab_ce_backward", "add_inplace", "copy",
        "embedding_forward", "embedding_backward", "sum_squares", "adamw_step", "zero_grad"}
missing = need - n0.get("compute", set())
print(f"level0 compute kernels: {sorted(n0.get('compute', set()))}")
if missing:
    print(f"FAIL level0 lacks compute events {sorted(missing)}"); bad += 1
if not {"data", "logging"} <= n0.get("host_work", set()):
    print(f"FAIL level0 lacks host work data/logging: {sorted(n0.get('host_work', set()))}"); bad += 1
for cat in ("compute", "comm", "host_work"):
    if n0.get(cat, set()) != n1.get(cat, set()):
        print(f"FAIL {cat} names differ between levels: level0 only {sorted(n0.get(cat, set()) - n1.get(cat, set()))}, "
              f"level1 only {sorted(n1.get(cat, set()) - n0.get(cat, set()))}"); bad += 1
print(f"compute events: {sum(c0.values())} at level0, {sum(c1.values())} at level1")
for key in sorted(set(c0) | set(c1)):
    if c0[key] != c1[key]:
        print(f"FAIL pid {key[0]} {key[1]}: {c0[key]} compute events at level0, {c1[key]} at level1"); bad += 1
sys.exit(1 if bad else 0)
PY
levels_rc=$?
sed 's/^/    /' "$TMP/levels"
check "level0 and level1 record the same categories (every kernel, host work) and compute events" test "$levels_rc" -eq 0
"$COC" analyze "$trace0" >"$TMP/analyze0" 2>&1
check "coc analyze explains Free by host work and its longest gaps" \
  grep -q "free .* = host work .* + idle .*; longest: .* at .* (after .*, before .*)" "$TMP/analyze0"
grep "= host work" "$TMP/analyze0" | head -2 | sed 's/^/    /'

# Two tp groups of one name (tp 2 × dp 2 on 4 ranks): each collective names its group by the world rank of the
# group's rank 0 (group_root), and `coc analyze` matches the waits for a later rank within each group: known on
# every rank, inside its exposed time, and each rank waits only for a rank of its own groups.
PROF4="$TMP/prof4"
timeout 300 "$LAUNCH" -n 4 -- "$COC" train --train-iters 3 --tp 2 --num-layers 2 --seq-length 64 --profile \
  --profile-step-start 1 --profile-dir "$PROF4" --no-progress --sample-length 0 >"$TMP/out4" 2>"$TMP/err4"
rc4=$?
trace4=$(ls "$PROF4"/coc_trace_*.json 2>/dev/null | head -1)
check "tp 2 x dp 2 profiled run exits 0 (got $rc4)" test "$rc4" -eq 0 -a -n "$trace4"
"$COC" analyze -q --json "$TMP/a4.json" "$trace4" >/dev/null 2>"$TMP/a4.err"
python3 - "$trace4" "$TMP/a4.json" >"$TMP/groups" 2>&1 <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
roots = {}
for e in doc["traceEvents"]:
    if e.get("ph") == "X" and e.get("cat") == "comm" and "seq" in e.get("args", {}):
        roots.setdefault((e["args"]["comm"], e["pid"]), set()).add(e["args"]["group_root"])
want = {"tp": {0: 0, 1: 0, 2: 2, 3: 2}, "dp": {0: 0, 1: 1, 2: 0, 3: 1}, "world": {r: 0 for r in range(4)}}
bad = 0
for (comm, pid), got in sorted(roots.items()):
    if comm in want and got != {want[comm][pid]}:
        print(f"FAIL {comm} on rank {pid}: group_root {sorted(got)}, want {want[comm][pid]}"); bad += 1
if ("tp", 2) not in roots:
    print("FAIL no tp collective traced on rank 2"); bad += 1
rep = json.load(open(sys.argv[2]))
for rr in rep["ranks"]:
    t = rr["total"]
    w = t.get("late_wait_ns", -1)
    peer = rr.get("waited_for", {}).get("rank")
    print(f"rank {rr['rank']}: exposed {t['exposed_ns']} ns, waiting for a later rank {w} ns (most for rank {peer})")
    if not 0 <= w <= t["exposed_ns"]:
        print("FAIL the wait is unknown or outside the exposed time"); bad += 1
    # A rank shares a group with its tp partner (r ^ 1), its dp partner (r ^ 2) and the world, so any rank may be
    # waited for; but never itself.
    if peer == rr["rank"]:
        print("FAIL a rank waited for itself"); bad += 1
sys.exit(1 if bad else 0)
PY
groups_rc=$?
sed 's/^/    /' "$TMP/groups"
check "tp 2 x dp 2: collectives name their group; waits are matched within it" test "$groups_rc" -eq 0

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
