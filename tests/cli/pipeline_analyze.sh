#!/usr/bin/env bash
# coc-test-timeout: 300
# Pipeline parallelism in the profile and in coc analyze (issue 34; docs/analysis.md "Pipeline bubble",
# docs/profiling.md): `coc train --pp 2 --profile` on 2 ranks writes a trace whose stage transfers are on a
# "comm pp" track per rank and whose metadata carries P and M; the trace passes the Perfetto importer's rules
# (profile_validate.py); `coc analyze --json` gives each rank a "pp" communicator row and a bubble per step next to
# the ideal (P − 1)/(M + P − 1); the table and the HTML page show the bubble. A run without stages has none.
source "$(dirname "$0")/common.bash"
C=(train --train-iters 3 --num-layers 4 --seq-length 64 --no-progress --sample-length 0 --tp 1
   --global-batch-size 8 --micro-batch-size 2 --profile --profile-step-start 1)

timeout 240 "$LAUNCH" -n 2 -- "$COC" "${C[@]}" --pp 2 --profile-dir "$TMP/pp" >"$TMP/train.out" 2>&1
check "coc train --pp 2 --profile ran" grep -q "profile: trace written" "$TMP/train.out" ||
  sed 's/^/    /' "$TMP/train.out" | tail -20
trace=$(ls "$TMP"/pp/coc_trace_*.json 2>/dev/null | head -1)
check "the trace exists" test -n "$trace"
check "the trace passes the importer's rules" python3 "$ROOT/tests/cli/profile_validate.py" "$trace" 2 2
check "a 'comm pp' track per rank" python3 - "$trace" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
tracks = {(e["pid"], e["tid"]) for e in d["traceEvents"]
          if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == "comm pp"}
pp = [e for e in d["traceEvents"] if e["ph"] == "X" and e.get("cat") == "comm"
      and (e["name"] == "pp_recv_wait" or str(e["args"].get("comm", "")).startswith("pp-link"))]
assert {p for p, _ in tracks} == {0, 1}, tracks
assert pp and all(e["tid"] >= 96 for e in pp), "a stage transfer off the pp track"
assert d["otherData"]["pipeline_model_parallel_size"] == 2 and d["otherData"]["num_microbatches"] == 4, d["otherData"]
EOF

"$COC" analyze --json "$TMP/a.json" --html "$TMP/a.html" "$trace" >"$TMP/table.txt" 2>&1
check "coc analyze --json --html ran" test -s "$TMP/a.json"
check "a pp row, a bubble per rank and step next to the ideal 20% (P 2, M 4), per-op rows" \
  python3 - "$TMP/a.json" <<'EOF'
import json, re, sys
r = json.load(open(sys.argv[1]))
assert [k["rank"] for k in r["ranks"]] == [0, 1]
for k in r["ranks"]:
    pp = [g for g in k["comm_groups"] if g["name"] == "pp"]
    assert pp and pp[0]["exposed_ns"] > 0, k["comm_groups"]
    assert not [g for g in k["comm_groups"] if g["name"].startswith("pp-link")], k["comm_groups"]
    p = k["pipeline"]
    assert p["stages"] == 2 and p["micro_batches"] == 4 and abs(p["ideal_bubble_pct"] - 20.0) < 1e-9, p
    assert p["waits"] == 2 * 4, p  # 2 steps × M: stage 0 waits for each gradient, stage 1 for each activation
    assert len(p["steps"]) == len(k["steps"]) == 2, p
    assert sum(s["bubble_ns"] for s in p["steps"]) == p["bubble_ns"] > 0, p
    # The bubble is exposed pp communication: inside the pp row's exposed time and the rank's exposed time.
    assert p["bubble_ns"] <= pp[0]["exposed_ns"] and p["bubble_ns"] <= k["total"]["exposed_ns"], (p, pp)
    # Per operation: layer indices folded, the waits a row of their own under "pp", and the rows of a communicator
    # hold its collectives, each row's exposed time inside the rank's.
    ops = k["comm_ops"]
    assert ops and not [o for o in ops if re.search(r"layers\.[0-9]", o["op"])], ops
    assert [o for o in ops if o["collective"] == "pp_recv_wait" and o["communicator"] == "pp"], ops
    for g in k["comm_groups"]:
        assert sum(o["count"] for o in ops if o["communicator"] == g["name"]) == g["count"], (g, ops)
    assert all(o["exposed_ns"] <= min(o["communication_ns"], k["total"]["exposed_ns"]) for o in ops), ops
    print(f"    rank {k['rank']}: bubble {p['bubble_pct']:.1f}% of the steps (ideal {p['ideal_bubble_pct']:.1f}%), "
          f"pp exposed {pp[0]['exposed_ns'] / 1e6:.1f} ms")
EOF
check "the table shows the bubble" grep -q "ideal 1F1B bubble (P − 1)/(M + P − 1) = 20.0% (P 2, M 4)" "$TMP/table.txt"
check "the HTML page shows the bubble" grep -q "pipeline bubble" "$TMP/a.html"
check "the table and the HTML page show the per-op rows" \
  bash -c "grep -q 'exposed communication by operation' '$TMP/table.txt' &&
           grep -q 'exposed communication by operation' '$TMP/a.html'"

timeout 240 "$LAUNCH" -n 2 -- "$COC" "${C[@]}" --profile-dir "$TMP/flat" >"$TMP/flat.out" 2>&1
flat=$(ls "$TMP"/flat/coc_trace_*.json 2>/dev/null | head -1)
"$COC" analyze --json - "$flat" >"$TMP/flat.json" 2>/dev/null
check "without stages: no pp row and no bubble" python3 -c "
import json, sys
r = json.load(open('$TMP/flat.json'))
assert all('pipeline' not in k and not [g for g in k['comm_groups'] if g['name'] == 'pp'] for k in r['ranks'])"
finish
