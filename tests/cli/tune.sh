#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc tune` on 2 ranks with a tiny model and short measuring runs: it finishes inside its budget and writes a YAML
# that `coc train --config` loads; switches that do not apply are skipped with their reason; a candidate over
# --memory-limit is rejected; --budget 0 returns the baseline without measuring; bad input is one clear line.
# No timing assertions (the machine is shared): which switches are kept is not checked.
source "$(dirname "$0")/common.bash"
tiny=(--num-layers 1 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --hidden-size 96
      --num-attention-heads 4 --ffn-hidden-size 192 --deterministic --train-iters 3 --tune-iters 6 --skip-pairs 1)
run_tune() { timeout 400 "$LAUNCH" -n 2 -- "$COC" tune "${tiny[@]}" "$@" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }

start=$SECONDS
check "tune runs on a tiny model" run_tune --budget 4 --out "$TMP/tuned.yaml" --json "$TMP/tune.json"
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
print("tune JSON ok:", len(tried), "tried,", len(skipped), "skipped")
PY

check "tune rejects a candidate over --memory-limit" run_tune --budget 4 --memory-limit 1 --no-profile \
  --allow-math-change --out "$TMP/mem.yaml"
check "tune: the rejection names the limit" grep -q "rejected (peak RSS [0-9]* MiB per rank exceeds --memory-limit 1 MiB)" "$TMP/out"
check "tune: nothing over the limit is kept" grep -q "Kept: the baseline" "$TMP/mem.yaml"
check "tune --allow-math-change tries --gemm-backend" grep -Eq "^ +[0-9]+  --gemm-backend (openblas|onednn) .*rejected" "$TMP/out"

# FSDP at dp 2: the prefetch depth is raised one step at a time from 0 (kept or not, depth 1 is tried first), and the
# YAML that holds the depth loads.
check "tune walks the FSDP prefetch depth" run_tune --budget 3 --no-profile --tp 1 --global-batch-size 4 \
  --data-parallel-sharding-strategy optim_grads_params --num-to-forward-prefetch 0 --num-to-backward-prefetch 0 \
  --out "$TMP/fsdp.yaml"
check "tune: prefetch depth 1 tried against 0" grep -Eq "^ +[0-9]+  --num-to-forward-prefetch 1 --num-to-backward-prefetch 1 .*(kept|rejected)" "$TMP/out"
check "coc train --config loads the FSDP YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/fsdp.yaml' \
  --sample-length 0 >'$TMP/trainf.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/trainf.out'"

check "tune --budget 0 returns the baseline" run_tune --budget 0 --no-sequence-parallel --coc-parallel-num auto \
  --out "$TMP/zero.yaml"
check "tune --budget 0: nothing measured, the YAML is the baseline" bash -c "grep -q 'nothing is measured' '$TMP/out' && \
  grep -q 'Kept: the baseline' '$TMP/zero.yaml' && grep -qx 'sequence-parallel: false' '$TMP/zero.yaml' && grep -qx 'coc-parallel-num: auto' '$TMP/zero.yaml' && grep -q 'not tried: --budget 0' '$TMP/out'"
check "tune --budget 0: --use-mc2 skipped without sequence parallelism" \
  grep -q "skipped: --use-mc2: needs --sequence-parallel with tp > 1" "$TMP/out"
check "coc train --config loads the --budget 0 YAML" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train --config '$TMP/zero.yaml' \
  --sample-length 0 >'$TMP/train0.out' 2>&1 && grep -q 'trained 3 iterations' '$TMP/train0.out'"

# A budget smaller than three baseline runs: the baseline is measured, every switch is listed as not tried.
check "tune with a tiny budget" run_tune --budget 0.01 --out "$TMP/tiny.yaml"
check "tune: the switches left when the budget runs out are listed" bash -c "grep -q 'the budget (0.01 min) runs out' \
  '$TMP/out' && grep -q 'not tried: the budget ran out' '$TMP/out' && grep -q 'Kept: the baseline' '$TMP/tiny.yaml'"

expect_error tune_negative_budget "--budget must be >= 0 minutes" 2 -- tune --budget -1
expect_error tune_negative_memory "--memory-limit must be >= 0 MiB" 2 -- tune --memory-limit -5
expect_error tune_unknown_flag "not expected: --no-such-flag" 2 -- tune --no-such-flag
expect_error tune_too_few_iters "--tune-iters 2 leaves no timed pair" 2 -- tune --tune-iters 2 --skip-pairs 1
help=$("$COC" tune --help 2>&1)
for flag in --budget --memory-limit --out --json --allow-math-change --tune-iters --config --coc-parallel-num; do
  check "tune --help lists $flag" grep -q -- "$flag" <<<"$help"
done
finish
