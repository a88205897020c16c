#!/usr/bin/env bash
# coc-test-timeout: 120
# `coc analyze` on PyTorch CPU-only traces (trace_reader_torch_cpu.cpp): the gloo TP=2 run of PyTorch 1.13 (bare
# JSON array) and HTA's Kineto cpu_only sample (or, without the shared traces, generated ones of the same layouts). Every step's computing, communication, overlapped, exposed and
# free time must equal what the script below computes from the events by its own route (an operator computes
# when no collective of its thread lies inside it; the union of those, against the union of all collectives).
# The gloo all-reduces block the main thread: overlap near 0%. Also: `--json -` and `-` (stdin).
source "$(dirname "$0")/common.bash"
# The real traces sit in the shared checkout beside the repository (../shared/traces, or COC_SHARED_DIR for a
# worktree elsewhere); a fresh clone has none, and then tests/cli/data/make_torch_cpu_traces.py writes traces of the
# same two layouts (made up, seeded), so that the test runs from the repository alone.
TRACES="${COC_SHARED_DIR:-$ROOT/../shared}/traces/kineto"
if [ ! -d "$TRACES/torch_cpu_gloo_tp2" ] || [ ! -d "$TRACES/cpu_only" ]; then
  TRACES="$TMP/traces"
  python3 "$ROOT/tests/cli/data/make_torch_cpu_traces.py" "$TRACES"
  echo "note: no shared traces beside the repository: testing the generated ones in $TRACES"
fi
cat >"$TMP/expect.py" <<'PY'
import gzip, json, sys

COMM = ("gloo:", "c10d::", "c10d:", "nccl:", "mpi:", "record_param_comms")

def ns(v):
    return round(float(v) * 1000)

def union(ivs):
    out = []
    for b, e in sorted(ivs):
        if e <= b:
            continue
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out

def measure(s):
    return sum(e - b for b, e in s)

def intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out

def expected(path):
    d = json.load(gzip.open(path))
    events = d if isinstance(d, list) else d["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in ops if e["name"].startswith("ProfilerStep")]
    comm = [e for e in ops if e["name"].startswith(COMM)]
    compute = [e for e in ops if not e["name"].startswith(COMM) and not e["name"].startswith("ProfilerStep")
               and e.get("cat", "cpu_op") == "cpu_op"]
    comm_by_thread = {}
    for e in comm:
        comm_by_thread.setdefault((e["pid"], e["tid"]), []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    busy = []
    for e in compute:
        b, en = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        # Waiting, not computing: a collective of the same thread runs inside this operator.
        if any(b <= cb and ce <= en for cb, ce in comm_by_thread.get((e["pid"], e["tid"]), [])):
            continue
        busy.append((b, en))
    C = union(busy)
    M = union([(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in comm])
    out = []
    for b, e, name in sorted(steps):
        W = [[b, e]]
        c, m = intersect(C, W), intersect(M, W)
        both = measure(intersect(c, m))
        out.append({"name": name, "window": e - b, "computing": measure(c), "communication": measure(m),
                    "overlapped": both, "exposed": measure(m) - both,
                    "free": (e - b) - (measure(c) + measure(m) - both)})
    return out

report = json.load(open(sys.argv[1]))
bad = 0
for rk in report["ranks"]:
    want = expected(rk["file"])
    got = rk["steps"]
    assert rk["format"] == "torch-cpu", rk["format"]
    assert [s["name"] for s in got] == [w["name"] for w in want], ([s["name"] for s in got], [w["name"] for w in want])
    for s, w in zip(got, want):
        for k in ("window", "computing", "communication", "overlapped", "exposed", "free"):
            # Kineto's fractional µs: each bound may round differently by 1 ns.
            if abs(s[k + "_ns"] - w[k]) > 64:
                print("rank %s %s %s: coc %d, script %d" % (rk["rank"], s["name"], k, s[k + "_ns"], w[k]))
                bad += 1
        print("rank %s %s: computing %.1f%%, communication %.1f%%, overlap %.2f%%, free %.1f%%" % (
            rk["rank"], s["name"], 100 * w["computing"] / w["window"], 100 * w["communication"] / w["window"],
            100 * w["overlapped"] / max(1, w["communication"]), 100 * w["free"] / w["window"]))
        if sys.argv[2] == "gloo":
            assert s["computing_pct"] > 50 and s["communication_ns"] > 0.02 * s["window_ns"], s
            assert s["overlap_pct"] < 1.0, s
sys.exit(1 if bad else 0)
PY

"$COC" analyze --json - "$TRACES/torch_cpu_gloo_tp2" >"$TMP/gloo.json" 2>"$TMP/gloo.err"
check "coc analyze --json - writes the report to stdout (exit $?)" python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/gloo.json"
check "no file named '-'" test ! -e ./-
python3 "$TMP/expect.py" "$TMP/gloo.json" gloo >"$TMP/gloo.check" 2>&1
check "torch_cpu_gloo_tp2: 2 ranks x 3 steps match the script; overlap < 1%, computing and communication shown" test $? -eq 0
sed 's/^/    /' "$TMP/gloo.check" | tail -7
check "two ranks, ranks 0 and 1 from the file names" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
assert sorted(x["rank"] for x in r) == [0, 1] and all(len(x["steps"]) == 3 for x in r)' "$TMP/gloo.json"

"$COC" analyze --json - "$TRACES/cpu_only" >"$TMP/cpu_only.json" 2>&1
python3 "$TMP/expect.py" "$TMP/cpu_only.json" kineto >"$TMP/cpu_only.check" 2>&1
check "Kineto cpu_only: the step matches the script" test $? -eq 0
sed 's/^/    /' "$TMP/cpu_only.check" | tail -2

# The table and the HTML follow; '-' as the trace reads standard input; the format can be forced.
"$COC" analyze "$TRACES/torch_cpu_gloo_tp2" --html "$TMP/gloo.html" >"$TMP/table" 2>&1
check "the table shows the torch-cpu format and an exposed-communication verdict" \
  grep -q "(torch-cpu)" "$TMP/table"
check "the HTML page is written" grep -q "rank 1" "$TMP/gloo.html"
zcat "$TRACES/torch_cpu_gloo_tp2/rank1.pt.trace.json.gz" | "$COC" analyze --format torch-cpu --json - - >"$TMP/stdin.json" 2>"$TMP/stdin.err"
check "'-' reads the trace from standard input" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
assert len(r) == 1 and len(r[0]["steps"]) == 3 and r[0]["format"] == "torch-cpu"' "$TMP/stdin.json"
"$COC" analyze "$TRACES/torch_cpu_gloo_tp2" --svg - >"$TMP/svg" 2>&1
check "--svg - writes the SVG to stdout, no table" bash -c "head -c 5 '$TMP/svg' | grep -q '<svg' && ! grep -q 'rank balance' '$TMP/svg'"
"$COC" analyze "$TRACES/cpu_only" --svg - --html - >/dev/null 2>"$TMP/two.err"
check "two reports on stdout: one error line" grep -q "coc: error: only one of --json, --csv, --html and --svg can write to standard output" "$TMP/two.err"
# coc's run beside PyTorch's: both rank 0s and both rank 1s, no "duplicate rank", no balance across the two runs.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 3 --num-layers 1 --hidden-size 64 --num-attention-heads 4 \
  --ffn-hidden-size 128 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress \
  --profile --profile-step-start 1 --profile-dir "$TMP/coc_profile" >/dev/null 2>&1
"$COC" analyze "$TMP/coc_profile" "$TRACES/torch_cpu_gloo_tp2" >"$TMP/both" 2>&1
check "coc analyze coc_profile/ torch_profile/ shows both runs per rank" \
  test "$(grep -c '^rank [01] .*(coc)$' "$TMP/both")" -eq 2 -a "$(grep -c '^rank [01] .*(torch-cpu)$' "$TMP/both")" -eq 2
check "and no rank balance across the two runs" bash -c "! grep -q 'rank balance' '$TMP/both'"
finish
