#!/usr/bin/env bash
# coc-test-timeout: 120
# `coc analyze` on PyTorch CPU-only traces (trace_reader_torch_cpu.cpp): a gloo TP=2 run of PyTorch 1.13 (bare
# JSON array) and a Kineto cpu_only trace (the layout of HTA's sample). Every step's computing, communication,
# overlapped, exposed and free time must equal what the script below computes from the events by its own route (an
# operator computes when no collective of its thread lies inside it; the union of those, against the union of all
# collectives). The gloo all-reduces block the main thread: overlap near 0%. Also: `--json -` and `-` (stdin).
#
# The checks run on two sets: coc's synthetic traces always (torch_cpu_gloo_tp2 written by
# tests/cli/data/make_torch_cpu_traces.py, made up and seeded; cpu_only from tests/analysis/data/kineto), and the real
# ones in the shared checkout beside the repository (../shared/traces, or COC_SHARED_DIR) when it is there.
source "$(dirname "$0")/common.bash"
SHARED="${COC_SHARED_DIR:-$ROOT/../shared}/traces/kineto"
python3 "$ROOT/tests/cli/data/make_torch_cpu_traces.py" "$TMP/synthetic"
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

# check_cpu_traces LABEL GLOO_DIR CPU_ONLY_DIR: the checks on one set of traces.
check_cpu_traces() {
  local label="$1" gloo="$2" cpu_only="$3"
  local T="$TMP/$label"
  mkdir -p "$T"
  echo "-- $label traces: $gloo, $cpu_only"
  "$COC" analyze --json - "$gloo" >"$T/gloo.json" 2>"$T/gloo.err"
  check "$label: coc analyze --json - writes the report to stdout (exit $?)" python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/gloo.json"
  check "$label: no file named '-'" test ! -e ./-
  python3 "$TMP/expect.py" "$T/gloo.json" gloo >"$T/gloo.check" 2>&1
  check "$label: torch_cpu_gloo_tp2: 2 ranks x 3 steps match the script; overlap < 1%, computing and communication shown" test $? -eq 0
  sed 's/^/    /' "$T/gloo.check" | tail -7
  check "$label: two ranks, ranks 0 and 1 from the file names" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
assert sorted(x["rank"] for x in r) == [0, 1] and all(len(x["steps"]) == 3 for x in r)' "$T/gloo.json"

  "$COC" analyze --json - "$cpu_only" >"$T/cpu_only.json" 2>&1
  python3 "$TMP/expect.py" "$T/cpu_only.json" kineto >"$T/cpu_only.check" 2>&1
  check "$label: Kineto cpu_only: the step matches the script" test $? -eq 0
  sed 's/^/    /' "$T/cpu_only.check" | tail -2

  # The table and the HTML follow; '-' as the trace reads standard input; the format can be forced.
  "$COC" analyze "$gloo" --html "$T/gloo.html" >"$T/table" 2>&1
  check "$label: the table shows the torch-cpu format and an exposed-communication verdict" \
    grep -q "(torch-cpu)" "$T/table"
  check "$label: the HTML page is written" grep -q "rank 1" "$T/gloo.html"
  zcat "$gloo/rank1.pt.trace.json.gz" | "$COC" analyze --format torch-cpu --json - - >"$T/stdin.json" 2>"$T/stdin.err"
  check "$label: '-' reads the trace from standard input" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
assert len(r) == 1 and len(r[0]["steps"]) == 3 and r[0]["format"] == "torch-cpu"' "$T/stdin.json"
  "$COC" analyze "$gloo" --svg - >"$T/svg" 2>&1
  check "$label: --svg - writes the SVG to stdout, no table" bash -c "head -c 5 '$T/svg' | grep -q '<svg' && ! grep -q 'rank balance' '$T/svg'"
  "$COC" analyze "$cpu_only" --svg - --html - >/dev/null 2>"$T/two.err"
  check "$label: two reports on stdout: one error line" grep -q "coc: error: only one of --json, --csv, --html and --svg can write to standard output" "$T/two.err"
  # coc's run beside PyTorch's: both rank 0s and both rank 1s, no "duplicate rank", no balance across the two runs.
  "$COC" analyze "$TMP/coc_profile" "$gloo" >"$T/both" 2>&1
  check "$label: coc analyze coc_profile/ torch_profile/ shows both runs per rank" \
    test "$(grep -c '^rank [01] .*(coc)$' "$T/both")" -eq 2 -a "$(grep -c '^rank [01] .*(torch-cpu)$' "$T/both")" -eq 2
  check "$label: and no rank balance across the two runs" bash -c "! grep -q 'rank balance' '$T/both'"
}

# One coc run to set beside PyTorch's (two ranks, profiled).
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 3 --num-layers 1 --hidden-size 64 --num-attention-heads 4 \
  --ffn-hidden-size 128 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress \
  --profile --profile-step-start 1 --profile-dir "$TMP/coc_profile" >/dev/null 2>&1
check_cpu_traces synthetic "$TMP/synthetic/torch_cpu_gloo_tp2" "$ROOT/tests/analysis/data/kineto/cpu_only"
if [ -d "$SHARED/torch_cpu_gloo_tp2" ] && [ -d "$SHARED/cpu_only" ]; then
  check_cpu_traces shared "$SHARED/torch_cpu_gloo_tp2" "$SHARED/cpu_only"
else
  echo "skip: $SHARED not found (the shared real traces); the checks ran on the synthetic traces only"
fi
finish
