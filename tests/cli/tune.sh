#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc tune` on 2 ranks with a tiny model and short measuring runs: it finishes inside its budget and writes a YAML
# that `coc train --config` loads; switches that do not apply are skipped with their reason; a candidate over
# --memory-limit is rejected; --budget 0 returns the baseline without measuring; bad input is one clear line. The
# verify step (the chosen configuration's profile: verdicts, exposure per communicator, host-bound evidence) is in the
# text, the JSON and the YAML's header; --report writes the HTML with the decision path; the math changes (--bf16,
# --grad-reduce-in-bf16) are skipped without --allow-math-change; --overlap-p2p-communication applies at pp 2 only,
# alternating; --candidate measures one combination; --families walks only those (and the YAML keeps no tune flag);
# bench/tune_sweep.sh --dry-run lists its combinations; bench/tune_vs_sweep.sh refuses bad arguments up front. The
# layout family (a math change) lists the neighbouring layouts, skips one coc train refuses with its reason, and a
# layout candidate runs by whole runs, and a kept one has the families before it walked again; recomputation is tried
# first over --memory-limit and skipped without one. No timing assertions (the machine is shared): which switches
# are kept is not checked.
source "$(dirname "$0")/common.bash"
tiny=(--num-layers 1 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --hidden-size 96
      --num-attention-heads 4 --ffn-hidden-size 192 --deterministic --train-iters 3 --tune-iters 6 --skip-pairs 1)
run_tune() { timeout 400 "$LAUNCH" -n 2 -- "$COC" tune "${tiny[@]}" "$@" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }

start=$SECONDS
check "tune runs on a tiny model" run_tune --budget 4 --out "$TMP/tuned.yaml" --json "$TMP/tune.json" \
  --report "$TMP/tune.html"
took=$((SECONDS - start))
check "tune finishes inside its budget (${took} s of 240 s, start-up included)" test "$took" -lt 260
check "tune prints a progress line per candidate" grep -q "coc tune \[.*\] trying --" "$TMP/out"
check "tune reports the keep rule and the result" bash -c "grep -q 'keep rule' '$TMP/out' && grep -q 'tuned: .* -> $TMP/tuned.yaml' '$TMP/out'"
check "tune skips an inapplicable switch with its reason" \
  grep -q "skipped: --overlap-grad-reduce: needs data or context parallelism (dp × cp > 1)" "$TMP/out"
check "tune compares --comm-engine by whole runs" grep -Eq "^ +[0-9]+  --comm-engine thread \[whole runs\] .*(kept|rejected)" "$TMP/out"
check "tune's YAML keeps the given flags" bash -c "grep -qx 'num-layers: 1' '$TMP/tuned.yaml' && grep -qx 'train-iters: 3' '$TMP/tuned.yaml' && ! grep -q 'tune-iters\|budget' '$TMP/tuned.yaml'"
check "coc train --config loads tune's YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/tuned.yaml' \
  --sample-length 0 >'$TMP/train.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/train.out'"
check "tune JSON: steps, statuses and reasons" python3 - "$TMP/tune.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["command"] == "tune" and r["baseline_ms"] > 0, r
st = r["steps"]
assert {s["status"] for s in st} <= {"kept", "rejected", "skipped", "not tried"}, st
tried = [s for s in st if s["status"] in ("kept", "rejected")]
assert tried, "no candidate ran"
for s in tried:
    assert s["ms_before"] > 0 and s["ms_after"] > 0 and s["peak_rss_mib"] > 0 and s["reason"], s
    assert s["threshold"] >= 1.02, s
skipped = {s["family"]: s["reason"] for s in st if s["status"] == "skipped"}
assert "needs a MoE model" in skipped["ep-dispatcher"], skipped
assert "--allow-math-change" in skipped["gemm-backend"], skipped
assert (r["confirmation"] is None) == (not r["chosen"]) or r["confirmation"]["returned_baseline"], r
kept = [t for t in st if t["status"] == "kept"]
if r["confirmation"] is not None:  # one kept step: its own run is the confirmation, not repeated
    c = r["confirmation"]
    assert c["reused_step"] == (len(kept) == 1), (c, kept)
    assert not c["reused_step"] or c["pair_ratio_median"] == kept[0]["pair_ratio_median"], (c, kept)
assert "--allow-math-change" in skipped["bf16"] and "dp × cp > 1" in skipped["grad-reduce-in-bf16"], skipped
assert "needs pipeline parallelism" in skipped["overlap-p2p-communication"], skipped
# The second look (when one ran): the rejected switches that leaned their way, together, none of them decided since.
for s in [s for s in st if s["family"] == "second look"]:
    steps = [t for t in st if t["status"] == "rejected" and t["family"] != "second look"
             and t["pair_ratio_median"] > 1.0 and t["reason"].startswith("not faster")]
    leaned = {k: v for t in steps for k, v in t["keys"].items()}
    joined = [t for t in steps if all(s["keys"].get(k) == v for k, v in t["keys"].items())]
    assert len(joined) >= 2 and all(leaned.get(k) == v for k, v in s["keys"].items()), (s, leaned)
v = r["verify"]
assert v["of"] == ("baseline" if not r["chosen"] else "tuned"), v
if "not_profiled" not in v:  # the tuned profile needs what the budget leaves; the baseline's is always there
    p = v["profile"]
    assert p["ranks"] and isinstance(p["healthy"], bool) and p["verdict"]["exposed"] in ("ok", "watch", "needs work"), p
    assert p["communicators"] and "tp" in [g["name"] for g in p["communicators"]], p
    assert p["ops"] and all(o["op"] and o["exposed_ms"] <= o["communication_ms"] + 1e-6 for o in p["ops"]), p["ops"]
    assert p["host_bound"]["free"] in ("ok", "host-bound?") and p["host_bound"]["evidence"], p
else:
    assert v["of"] == "tuned" and v["not_profiled"] == "the budget ran out", v
print("tune JSON ok:", len(tried), "tried,", len(skipped), "skipped; verify of", v["of"])
PY
check "tune prints the verify section" bash -c "grep -Eq '^  verify, the (tuned configuration|baseline)'\''s profile.*: (healthy|not healthy)' '$TMP/out' \
  && grep -q 'still exposed, by communicator (summed over ranks): .*tp' '$TMP/out' && grep -q 'host-bound evidence: ' '$TMP/out' \
  || grep -q 'verify: not profiled (the budget ran out)' '$TMP/out'"
check "tune's YAML header carries the verify section" grep -q "^# verify" "$TMP/tuned.yaml"
check "tune skips --bf16 without --allow-math-change, with its reason" \
  grep -q "skipped: --bf16: .*pass --allow-math-change to try it" "$TMP/out"
check "tune --report: a self-contained HTML page with the decision path" python3 - "$TMP/tune.html" "$TMP/tune.json" <<'PY'
import json, re, sys, xml.etree.ElementTree as ET
h = open(sys.argv[1]).read()
r = json.load(open(sys.argv[2]))
assert h.startswith("<!DOCTYPE html>") and "<h2>Decision path</h2>" in h and "<h2>Verify</h2>" in h, h[:300]
assert "<script" not in h and not re.search(r'(src|href)=', h), "not self-contained"
svg = ET.fromstring(h[h.index("<svg"):h.index("</svg>") + 6])  # well-formed
ns = "{http://www.w3.org/2000/svg}"
classes = [g.get("class") for g in svg.iter(ns + "g")]
tried = [s for s in r["steps"] if s["status"] in ("kept", "rejected")]
assert classes[0] == "base" and classes[-1] == "end", classes
assert classes[1:-1] == [s["status"] for s in tried], (classes, [s["status"] for s in tried])
for s in r["steps"]:
    esc = s["reason"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#39;")
    assert esc.replace("\"", "&quot;") in h, s["reason"]
print("tune HTML ok:", len(tried), "tried steps drawn")
PY

check "tune rejects a candidate over --memory-limit" run_tune --budget 4 --memory-limit 1 --no-profile \
  --allow-math-change --out "$TMP/mem.yaml"
check "tune: the rejection names the limit" grep -q "rejected (peak RSS [0-9]* MiB per rank exceeds --memory-limit 1 MiB)" "$TMP/out"
check "tune: nothing over the limit is kept" grep -q "Kept: the baseline" "$TMP/mem.yaml"
check "tune --allow-math-change tries --gemm-backend" grep -Eq "^ +[0-9]+  --gemm-backend (openblas|onednn) .*rejected" "$TMP/out"
check "tune --allow-math-change tries --bf16" grep -Eq "^ +[0-9]+  --bf16 +(\[whole runs\] +)?([0-9]|skipped: refused).*(rejected|refused)" "$TMP/out"
# Over the limit every candidate runs as whole runs (its own peak), recomputation first.
check "tune: over --memory-limit, recomputation is tried first" \
  grep -Eq "^ +1  --recompute-granularity selective \[whole runs\] .*rejected \(peak RSS" "$TMP/out"
check "tune --allow-math-change tries a neighbouring layout by whole runs" grep -Eq \
  "^ +[0-9]+  --tensor-model-parallel-size 1 --context-parallel-size 2 --pipeline-model-parallel-size 1 .*\[whole runs\] .*rejected" "$TMP/out"
check "tune --no-profile: the verify section says so" grep -q "verify: not profiled (--no-profile)" "$TMP/out"
# After a kept layout the families before it are walked again from the new best. At tp 2 × dp 1 the gradient
# reduction's family does not apply; --test-keep (hidden, tests only) keeps the first layout tried, tp 1 × cp 2,
# where it does. The one-layer model cannot split into pp 2, so a layout kept after it has cp or dp 2 too.
check "tune: a kept layout (--test-keep)" run_tune --budget 4 --no-profile --allow-math-change \
  --no-overlap-grad-reduce --families layout,overlap-grad-reduce --test-keep layout --out "$TMP/relayout.yaml"
check "tune: after the kept layout the families before it are walked again" bash -c "grep -Eq \
  'the layout is now tp 1 cp [12] pp 1 dp [12] \(was tp 2 cp 1 pp 1 dp 1\): the families before it are walked again' \
  '$TMP/out' && grep -Eq '^ +[0-9]+  --overlap-grad-reduce .*(kept|rejected)' '$TMP/out'"
check "tune: --test-keep stays out of the YAML" bash -c "! grep -q test-keep '$TMP/relayout.yaml'"

# Over --memory-limit: attention probabilities of 4 layers at S 1024 (16 MiB a layer per rank) put the baseline at
# about 150 MiB per rank and selective recomputation near 100: it is tried first, by whole runs (its own peak), and
# kept because it fits, whatever its speed; the confirmation does not hand the baseline back.
check "tune over --memory-limit" run_tune --budget 1 --no-profile --num-layers 4 --seq-length 1024 --memory-limit 120 \
  --families recompute-granularity --out "$TMP/rec.yaml"
check "tune: recomputation kept because it fits in --memory-limit" bash -c "grep -Eq \
  '^ +1  --recompute-granularity selective \[whole runs\] .* kept \(fits in --memory-limit 120 MiB where the best' \
  '$TMP/out' && grep -qx 'recompute-granularity: selective' '$TMP/rec.yaml' && ! grep -q 'baseline is returned' '$TMP/out'"

# FSDP at dp 2: the prefetch depth is raised one step at a time from 0 (kept or not, depth 1 is tried first), and the
# YAML that holds the depth loads.
check "tune walks the FSDP prefetch depth" run_tune --budget 3 --no-profile --tp 1 --global-batch-size 4 \
  --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 0 --num-to-backward-prefetch 0 \
  --out "$TMP/fsdp.yaml"
check "tune: prefetch depth 1 tried against 0" grep -Eq "^ +[0-9]+  --num-to-forward-prefetch 1 --num-to-backward-prefetch 1 .*(kept|rejected)" "$TMP/out"
check "tune: --grad-reduce-in-bf16 needs --bf16" grep -q "skipped: --grad-reduce-in-bf16: needs --bf16" "$TMP/out"
check "coc train --config loads the FSDP YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/fsdp.yaml' \
  --sample-length 0 >'$TMP/trainf.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/trainf.out'"

# Pipelined (pp 2): the trainer alternates a pipelined run's iterations as any other (every stage switches at the
# same boundary), so --overlap-p2p-communication, which applies here, is tried in one alternating run.
check "tune on a pipelined run" run_tune --budget 3 --no-profile --tp 1 --pp 2 --num-layers 2 --global-batch-size 4 \
  --out "$TMP/pp.yaml"
check "tune: --overlap-p2p-communication tried alternating at pp 2" \
  grep -Eq "^ +[0-9]+  --overlap-p2p-communication +[0-9]+\.[0-9].*(kept|rejected)" "$TMP/out"
check "coc train --config loads the pipelined YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/pp.yaml' \
  --sample-length 0 >'$TMP/trainp.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/trainp.out'"

# --candidate: one combination against the run, as bench/tune_sweep.sh measures each.
check "tune --candidate measures one combination" run_tune --candidate coc-parallel-num=4,coc-comm-algo=collective \
  --out "$TMP/cand.yaml" --json "$TMP/cand.json"
check "tune --candidate: one step, no baseline run" python3 -c "
import json, sys; r = json.load(open(sys.argv[1])); s = r['steps']
assert len(s) == 1 and s[0]['keys'] == {'coc-parallel-num': '4', 'coc-comm-algo': 'collective'} and s[0]['ms_after'] > 0, s
assert r['baseline_ms'] == 0 and r['verify'] is None, r" "$TMP/cand.json"
# A layout candidate: the mesh is built again for each of its whole runs, in one process.
check "tune --candidate runs a layout (tp 2 -> tp 1 × cp 2)" run_tune \
  --candidate tensor-model-parallel-size=1,context-parallel-size=2,sequence-parallel=false --json "$TMP/lay.json" \
  --out "$TMP/lay.yaml"
check "tune --candidate: the layout measured by whole runs" python3 -c "
import json, sys; s = json.load(open(sys.argv[1]))['steps']
assert len(s) == 1 and s[0]['whole_runs'] and s[0]['status'] in ('kept', 'rejected') and s[0]['ms_after'] > 0, s" \
  "$TMP/lay.json"
expect_error tune_bad_candidate "--candidate 'coc-parallel-num': 'coc-parallel-num' is not KEY=VALUE" 2 -- tune \
  --candidate coc-parallel-num
expect_error tune_candidate_unknown_flag "coc tune: --nosuchflag: not a coc train flag" 2 -- tune \
  --candidate nosuchflag=1
expect_error tune_candidate_bad_value "coc tune: --use-mc2 maybe" 2 -- tune --candidate use-mc2=maybe
check "bench/tune_sweep.sh --dry-run lists the combinations" bash -c "'$ROOT/bench/tune_sweep.sh' --dry-run --coc '$COC' \
  --families coc-parallel-num,comm-engine -- ${tiny[*]:0:17} >'$TMP/sweep' 2>&1 && cat '$TMP/sweep' && \
  grep -qx 'tune_sweep: 6 combination(s)' '$TMP/sweep' && grep -Eqx ' +whole runs +coc-parallel-num=8,comm-engine=thread' '$TMP/sweep'"
sweep_unknown() {
  local out rc
  out=$("$ROOT/bench/tune_sweep.sh" --dry-run --coc "$COC" --families no-such-switch -- "${tiny[@]:0:17}" 2>&1)
  rc=$?
  echo "$out"
  [ "$rc" -eq 2 ] && grep -q "unknown no-such-switch" <<<"$out"
}
check "bench/tune_sweep.sh refuses an unknown family" sweep_unknown
check "bench/tune_sweep.sh --dry-run sweeps the layouts of the world" bash -c "'$ROOT/bench/tune_sweep.sh' --dry-run \
  --coc '$COC' --allow-math-change --families layout -- ${tiny[*]:0:17} >'$TMP/sweep' 2>&1 && cat '$TMP/sweep' && \
  grep -qx 'tune_sweep: 4 combination(s)' '$TMP/sweep' && grep -Eqx ' +whole runs +tensor-model-parallel-size=1,\
context-parallel-size=1,pipeline-model-parallel-size=2,global-batch-size=2' '$TMP/sweep'"
check "bench/tune_sweep.sh --help" bash -c "'$ROOT/bench/tune_sweep.sh' --help | grep -q -- '--dry-run'"
check "bench/tune_vs_sweep.sh --help" bash -c "'$ROOT/bench/tune_vs_sweep.sh' --help | grep -q -- '--families'"
vs_sweep_refuses() {  # WANT ARGS...: exit 2 with WANT in the message, before any cluster comes up
  local want=$1 out rc
  shift
  out=$("$ROOT/bench/tune_vs_sweep.sh" --coc "$COC" "$@" 2>&1)
  rc=$?
  echo "$out"
  [ "$rc" -eq 2 ] && grep -qF -- "$want" <<<"$out"
}
check "bench/tune_vs_sweep.sh refuses a run without flags" vs_sweep_refuses "give the run to tune after '--'"
check "bench/tune_vs_sweep.sh refuses --budget 0" vs_sweep_refuses "budget must be >= 1" --budget 0 -- --model-preset tiny
check "bench/tune_vs_sweep.sh refuses --iters 1" vs_sweep_refuses "use --iters 6 or more" --iters 1 -- --model-preset tiny
check "bench/tune_vs_sweep.sh refuses a missing --sweep table" \
  vs_sweep_refuses "--sweep /nonexistent.md: no such file" --sweep /nonexistent.md -- --model-preset tiny
echo "| not a sweep table |" >"$TMP/not_a_sweep.md"
check "bench/tune_vs_sweep.sh refuses a --sweep file without the sweep's time" \
  vs_sweep_refuses "no 'N combination(s) in S s' line" --sweep "$TMP/not_a_sweep.md" -- --model-preset tiny

check "tune --budget 0 returns the baseline" run_tune --budget 0 --no-sequence-parallel --coc-parallel-num auto \
  --out "$TMP/zero.yaml"
check "tune --budget 0: nothing measured, the YAML is the baseline" bash -c "grep -q 'nothing is measured' '$TMP/out' && \
  grep -q 'Kept: the baseline' '$TMP/zero.yaml' && grep -qx 'sequence-parallel: false' '$TMP/zero.yaml' && grep -qx 'coc-parallel-num: auto' '$TMP/zero.yaml' && grep -q 'not tried: --budget 0' '$TMP/out'"
check "tune --budget 0: --use-mc2 skipped without sequence parallelism" \
  grep -q "skipped: --use-mc2: needs --sequence-parallel with tp > 1" "$TMP/out"
check "tune --budget 0: --micro-batch-size skipped without --allow-math-change" \
  grep -q "skipped: --micro-batch-size: .*pass --allow-math-change to try it" "$TMP/out"
check "tune --budget 0: the layout skipped without --allow-math-change" \
  grep -q "layout (tp, cp, pp, dp) .*skipped: layout: .*pass --allow-math-change to try it" "$TMP/out"
check "tune --budget 0: recomputation skipped without --memory-limit" \
  grep -q "skipped: --recompute-granularity: no --memory-limit; recomputation only adds compute" "$TMP/out"
# The switches compared by whole runs at dp 2: the sharding strategy (same bits) and, with --allow-math-change, the
# micro-batch size (the global batch kept).
check "tune --budget 0 at dp 2" run_tune --budget 0 --tp 1 --global-batch-size 4 --micro-batch-size 1 \
  --allow-math-change --out "$TMP/zero_dp.yaml"
check "tune at dp 2 lists the sharding strategy and the micro-batch size" bash -c "grep -Eq \
  '^ +[0-9]+  --data-parallel-sharding-strategy optim +not tried: --budget 0' '$TMP/out' && grep -Eq \
  '^ +[0-9]+  --micro-batch-size 2 +not tried: --budget 0' '$TMP/out'"
# The first neighbour of tp 1 × dp 2 (dp's 2 moved to tp), the global batch kept (coc's automatic one would change).
check "tune at dp 2 lists the layout tp 2" grep -Eq \
  "^ +[0-9]+  --tensor-model-parallel-size 2 --context-parallel-size 1 --pipeline-model-parallel-size 1 --global-batch-size 4 +not tried: --budget 0" "$TMP/out"
# A layout coc train refuses is skipped with its reason, and the next one gets its turn; when it refuses every
# neighbour the family says so. --memory-limit at --budget 0 (no peak measured) offers recomputation.
check "tune --budget 0: refused layouts" run_tune --budget 0 --tp 1 --global-batch-size 4 --micro-batch-size 1 \
  --num-attention-heads 3 --allow-math-change --memory-limit 100000 --out "$TMP/zero_lay.yaml"
check "tune: a layout coc train refuses is skipped with its reason" bash -c "grep -Eq \
  '^ +[0-9]+  --tensor-model-parallel-size 2 .* skipped: refused: --num-attention-heads 3 is not divisible by --tensor-model-parallel-size 2' \
  '$TMP/out' && grep -Eq '^ +[0-9]+  --tensor-model-parallel-size 1 --context-parallel-size 2 .* not tried: --budget 0' '$TMP/out'"
check "tune --budget 0 --memory-limit: recomputation offered" \
  grep -Eq "^ +[0-9]+  --recompute-granularity selective +not tried: --budget 0" "$TMP/out"
check "tune --budget 0: every neighbouring layout refused" run_tune --budget 0 --tp 1 --global-batch-size 4 \
  --micro-batch-size 1 --num-attention-heads 3 --seq-length 30 --allow-math-change --out "$TMP/zero_lay.yaml"
check "tune: the layout family says coc train refuses every neighbour" \
  grep -q "skipped: layout: coc train refuses every neighbouring layout of tp 1 cp 1 pp 1 dp 2 (the reasons above)" "$TMP/out"
check "coc train --config loads the --budget 0 YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/zero.yaml' \
  --sample-length 0 >'$TMP/train0.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/train0.out'"

# A budget smaller than three baseline runs: the baseline is measured, every switch is listed as not tried.
# --families keeps the walk to those: the others are skipped with that reason.
check "tune with a tiny budget" run_tune --budget 0.01 --out "$TMP/tiny.yaml" --families coc-parallel-num,comm-engine
check "tune: the switches left when the budget runs out are listed" bash -c "grep -q 'the budget (0.01 min) runs out' \
  '$TMP/out' && grep -q 'not tried: the budget ran out' '$TMP/out' && grep -q 'Kept: the baseline' '$TMP/tiny.yaml'"
check "tune --families: the other families are skipped" bash -c "grep -q 'skipped: --tp-comm-bulk-wgrad: not in \
--families' '$TMP/out' && ! grep -q 'skipped: --coc-parallel-num: not in' '$TMP/out' && \
  ! grep -q '^families:' '$TMP/tiny.yaml'"

expect_error tune_negative_budget "--budget must be >= 0 minutes" 2 -- tune --budget -1
expect_error tune_negative_memory "--memory-limit must be >= 0 MiB" 2 -- tune --memory-limit -5
expect_error tune_unknown_flag "not expected: --no-such-flag" 2 -- tune --no-such-flag
expect_error tune_unknown_family "coc tune: --families: 'no-such' is not a switch family; the families are" 2 -- \
  tune --families coc-parallel-num,no-such
expect_error tune_budget0_bad_batch "--global-batch-size 8 is not divisible by --micro-batch-size 3" 2 -- tune \
  --budget 0 --micro-batch-size 3 --global-batch-size 8
check "a refused tune leaves no --out file behind" bash -c "cd '$TMP' && ! timeout 120 '$LAUNCH' -n 2 -- '$COC' tune \
  --budget 0 --micro-batch-size 3 --global-batch-size 8 --out refused.yaml >/dev/null 2>&1 && [ ! -e refused.yaml ]"
expect_error tune_too_few_iters "--tune-iters 2 leaves no timed pair" 2 -- tune --tune-iters 2 --skip-pairs 1
help=$("$COC" tune --help 2>&1)
for flag in --budget --memory-limit --out --json --allow-math-change --tune-iters --config --coc-parallel-num --report \
  --candidate --families; do
  check "tune --help lists $flag" grep -q -- "$flag" <<<"$help"
done
finish
