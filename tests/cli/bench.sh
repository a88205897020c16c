#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc bench overlap` and `coc bench comm` on tiny sizes with 2 ranks: they run, print their tables, and write JSON
# records with the keys of docs/performance.md and the environment (checked with python3), plus an SVG; bad input is one
# clear error line; `coc bench w8a16` and `coc bench gemm` run on tiny GEMMs; `coc bench comm --dtype` adds 16-bit
# rows of half the bytes. No timing assertions.
source "$(dirname "$0")/common.bash"
cat >"$TMP/tiny.yaml" <<'YAML'
model: tiny
tp: 2
notes: "CLI test shapes"
problems:
  - {name: col, layer: column, m: 64, k: 32, n: 48}
  - {name: row, layer: row, m: 66, k: 40, n: 24}
YAML
run_bench() { timeout 300 "$LAUNCH" -n 2 -- "$COC" bench "$@" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }

check "bench overlap runs on tiny shapes (both engines, fused rows)" \
  run_bench overlap --inputs "$TMP/tiny.yaml" --coc-parallel-num 1,2,3 --reps 3 --warmup 1 --fused \
  --link-rate 10 --json "$TMP/overlap.json" --plot "$TMP/overlap.svg"
check "bench overlap JSON has every figure and the environment" python3 - "$TMP/overlap.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
env = r["environment"]
for k in ["mpi_vendor", "mpi_version", "thread_level", "binding", "blas_config", "link_rate", "git_revision", "date"]:
    assert k in env, k
assert len(env["binding"]) == 2
rows = r["rows"]
# col: all_gather; row: all_reduce + reduce_scatter; × 2 engines × 3 N × (plain, fused), plus the p2p schedule
# (default --coc-comm-algo collective,p2p) of all three ops at N = 2, 3, not fused
assert len(rows) == 3 * 2 * 3 * 2 + 3 * 2 * 2, len(rows)
assert sum(r["algo"] == "p2p" for r in rows) == 12
for row in rows:
    for k in ["t_gemm_ms", "t_comm_ms", "t_serial_ms", "t_overlap_ms"]:
        assert set(row[k]) == {"median", "min", "max"}, (k, row[k])
        assert row[k]["min"] <= row[k]["median"] <= row[k]["max"], (k, row[k])
    for k in ["t_link_ms", "t_ideal_ms", "S", "E_norm", "exposed_comm_ms", "delta", "sigma", "E_norm_cap",
              "pipeline_loss_ms", "fallbacks", "op", "engine", "N", "fused", "problem", "m", "k", "n"]:
        assert k in row, k
    assert row["t_link_ms"] is not None
assert {r["op"] for r in rows} == {"all_reduce", "reduce_scatter", "all_gather"}
print("overlap JSON ok:", len(rows), "rows")
PY
check "bench overlap SVG written" grep -q "<svg" "$TMP/overlap.svg"
check "bench overlap --dtype bf16 runs and says so" \
  run_bench overlap --inputs "$TMP/tiny.yaml" --coc-parallel-num 1,2 --reps 2 --warmup 0 --engine inline --fused \
  --dtype bf16 --json "$TMP/overlap16.json"
check "bench overlap --dtype bf16 header" grep -q "dtype bf16: .*2 bytes per element" "$TMP/out"
check "bench overlap --dtype bf16 halves the bytes" python3 - "$TMP/overlap.json" "$TMP/overlap16.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["dtype"] == "bf16" and a["dtype"] == "fp32"
full = {(r["problem"], r["op"]): r["bytes"] for r in a["rows"]}
for r in b["rows"]:
    assert r["bytes"] * 2 == full[(r["problem"], r["op"])], r
PY
expect_error bench_overlap_dtype "--dtype fp16 has no rows of its own" 2 -- bench overlap --dtype fp16
expect_error bench_overlap_dtype_bad "--dtype must be fp32 or bf16, got 'int8'" 2 -- bench overlap --dtype int8
expect_error bench_overlap_dtype_list "--dtype takes one type per run, got 'fp32,bf16'" 2 -- bench overlap --dtype fp32,bf16
check "bench overlap on the shipped reference file, scaled down" \
  run_bench overlap --inputs "$ROOT/bench/inputs/reference.yaml" --m-scale 0.01 --coc-parallel-num 2 --engine inline --reps 2 --warmup 0
for f in llama2-7b llama2-70b bloom-7b bloom-176b llama2-7b-tp32; do
  check "bench inputs $f loads (one tiny op)" run_bench overlap --inputs "$ROOT/bench/inputs/$f.yaml" --problem attn_out \
    --ops all_reduce --m-scale 0.02 --coc-parallel-num 2 --engine inline --reps 1 --warmup 0
done
check "bench comm sweeps sizes" run_bench comm --min-bytes 8192 --max-bytes 131072 --reps 3 --warmup 1 --json "$TMP/comm.json"
check "bench comm JSON has nccl-tests columns" python3 - "$TMP/comm.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert "environment" in r and r["environment"]["link_rate"] == "shared-memory"
rows = [x for x in r["rows"] if "skipped" not in x]
assert rows
for row in rows:
    for k in ["size_bytes", "count", "time_us", "algbw_gbps", "busbw_gbps", "op", "engine"]:
        assert k in row, k
    f = {"all_reduce": 1.0, "shm_all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5}[row["op"]]  # n = 2
    assert abs(row["busbw_gbps"] - row["algbw_gbps"] * f) < 1e-9 * max(1, row["algbw_gbps"]), row
assert {x["op"] for x in rows} >= {"all_reduce", "reduce_scatter", "all_gather"}
assert [x["size_bytes"] for x in rows if x["op"] == "all_reduce" and x["engine"] == "inline"] == [8192, 32768, 131072]
print("comm JSON ok:", len(rows), "rows")
PY
check "bench comm --dtype fp32,bf16,fp16" run_bench comm --ops all_reduce,reduce_scatter,all_gather,shm_all_reduce \
  --engine inline --dtype fp32,bf16,fp16 --min-bytes 4096 --max-bytes 4096 --reps 2 --warmup 1 --json "$TMP/comm16.json"
check "bench comm --dtype: 16-bit rows move half the bytes of the same count" python3 - "$TMP/comm16.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = {(x["op"], x["dtype"]): x for x in r["rows"] if "skipped" not in x}
for op in ["all_reduce", "reduce_scatter", "all_gather"]:
    for d in ["bf16", "fp16"]:
        assert rows[(op, d)]["count"] == rows[(op, "fp32")]["count"], (op, d)
        assert rows[(op, d)]["size_bytes"] * 2 == rows[(op, "fp32")]["size_bytes"], (op, d)
assert any(x.get("skipped") == "fp32 only" and x["op"] == "shm_all_reduce" for x in r["rows"]), r["rows"]
PY
expect_error bench_comm_bad_dtype "unknown value 'int8'" 2 -- bench comm --dtype fp32,int8
check "bench gemm runs every variant and writes JSON" run_bench gemm --shapes 17x33x9,1x64x5 --reps 2 --warmup 0 \
  --json "$TMP/gemm.json"
check "bench gemm JSON: fp32 per back end and bf16, per shape" python3 - "$TMP/gemm.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
got = sorted((x["shape"], x["variant"]) for x in r["rows"])
want = sorted((s, v) for s in ["17x33x9", "1x64x5"] for v in ["fp32 onednn", "fp32 openblas", "bf16 onednn"])
assert got == want, got
assert r["onednn"]["version"] and all(x["gflops"] > 0 for x in r["rows"])
PY
expect_error bench_gemm_bad_shape "--shapes: '17x33' is not MxKxN" 2 -- bench gemm --shapes 17x33
expect_error bench_gemm_zero_shape "--shapes: '0x4x4' is not MxKxN" 2 -- bench gemm --shapes 0x4x4
expect_error bench_gemm_bad_backend "unknown value 'mkl'" 2 -- bench gemm --backends mkl
# Capped at AVX2 (oneDNN's own ONEDNN_MAX_CPU_ISA), oneDNN 2.6 has no bf16 matmul: one line that says so and what to do.
export ONEDNN_MAX_CPU_ISA=AVX2
expect_error bench_gemm_bf16_unavailable "oneDNN has no kernel for bf16 inputs on this CPU; compute in fp32 here" 2 -- \
  bench gemm --dtype bf16 --shapes 4x4x4
unset ONEDNN_MAX_CPU_ISA
check "bench w8a16 runs and writes JSON" run_bench w8a16 --m 8 --k 256 --n 96 --w8a16 per-group:64 --reps 2 --warmup 0 \
  --panels 32,64 --json "$TMP/w8.json"
check "bench w8a16 JSON has the variants and weight bytes" python3 - "$TMP/w8.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["w8_weight_bytes"] * 3 < r["fp32_weight_bytes"], r
names = [x["variant"] for x in r["rows"]]
assert any("dequantise-all" in v for v in names) and any("panel 32" in v for v in names), names
assert all(x["time_ms"]["min"] <= x["time_ms"]["median"] <= x["time_ms"]["max"] for x in r["rows"])
print("w8a16 JSON ok:", names)
PY

expect_error bench_missing_inputs "does not exist" 2 -- bench overlap --inputs "$TMP/nope.yaml"
printf 'model: x\ntp: 2\nproblems: [ {name: a, m: 4\n' >"$TMP/bad.yaml"
expect_error bench_malformed_yaml "not valid YAML" 2 -- bench overlap --inputs "$TMP/bad.yaml"
printf 'model: x\ntp: 2\nproblems:\n  - {name: a, layer: column, m: 5, k: 4, n: 4}\n' >"$TMP/odd.yaml"
expect_error bench_m_not_divisible "not divisible by the run's tp=2" 2 -- bench overlap --inputs "$TMP/odd.yaml"
printf 'model: x\ntp: 2\nproblems:\n  - {name: a, layer: diagonal, m: 4, k: 4, n: 4}\n' >"$TMP/layer.yaml"
expect_error bench_unknown_layer "layer must be column or row" 2 -- bench overlap --inputs "$TMP/layer.yaml"
expect_error bench_unknown_op "unknown value 'all_to_all'" 2 -- bench overlap --inputs "$TMP/tiny.yaml" --ops all_to_all
expect_error bench_unknown_engine "unknown value 'spin'" 2 -- bench comm --engine spin
expect_error bench_bad_N "not an integer >= 1" 2 -- bench overlap --inputs "$TMP/tiny.yaml" --coc-parallel-num 0
expect_error bench_needs_subcommand "requires|subcommand" 2 -- bench
expect_error bench_inputs_directory "is a directory" 2 -- bench overlap --inputs "$TMP"
printf 'model: x\ntp: 2\nproblems:\n  - {name: a, layer: row, m: 4, k: 4, n: 4, ops: []}\n' >"$TMP/noops.yaml"
expect_error bench_empty_ops "'ops' must be a non-empty list" 2 -- bench overlap --inputs "$TMP/noops.yaml"
printf 'model: x\ntp: 2\nproblems:\n  - {name: a, layer: row, m: 4, k: 4, n: 4, ops: [all_gather, all_gather]}\n' \
  >"$TMP/twice.yaml"
expect_error bench_op_twice "listed twice" 2 -- bench overlap --inputs "$TMP/twice.yaml"
expect_error bench_nothing_selected "nothing to run: --ops all_reduce selects none" 2 -- \
  bench overlap --inputs "$TMP/tiny.yaml" --problem col --ops all_reduce
printf 'model: x\ntp: 2\nproblems:\n  - {name: huge, layer: row, m: 4000000000, k: 4000000, n: 4}\n' >"$TMP/huge.yaml"
expect_error bench_too_big "needs .* GiB of buffers per rank" 2 -- bench overlap --inputs "$TMP/huge.yaml"
# --problem checks only the problem it selects: an m that does not divide tp elsewhere in the file does not stop it.
printf 'model: x\ntp: 2\nproblems:\n  - {name: odd, layer: column, m: 5, k: 4, n: 4}\n%s\n' \
  '  - {name: ok, layer: column, m: 4, k: 4, n: 4}' >"$TMP/mixed.yaml"
check "bench overlap --problem ignores the other problems' shapes" \
  run_bench overlap --inputs "$TMP/mixed.yaml" --problem ok --engine inline --coc-parallel-num 1 --reps 1 --warmup 0
# Only p2p asked for: the auto row still runs (it picks its own algorithm), and so do the fused rows.
run_bench overlap --inputs "$TMP/tiny.yaml" --problem row --ops all_reduce --engine inline --coc-comm-algo p2p \
  --coc-parallel-num 1,auto --fused --reps 1 --warmup 0 >/dev/null
check "bench overlap --coc-comm-algo p2p keeps the auto and fused rows" bash -c \
  "grep -Ec '^row +all_reduce +inline +(1 +fused +yes|auto +->serial +no|auto +fused +yes) ' '$TMP/out' | grep -qx 3"

# coc bench train: one training run alternating N=1 and the given schedule; the medians of each side, the pairs'
# ratio and the per-iteration record; bad combinations refused with one line.
check "bench train alternates N=1 and overlap" run_bench train --train-iters 6 --skip-pairs 1 --coc-parallel-num 2 \
  --num-layers 1 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --deterministic --no-progress \
  --json "$TMP/train.json"
check "bench train: each iteration says its side" bash -c "grep -c '| N=1$' '$TMP/out' | grep -qx 3 && grep -c '| overlap$' '$TMP/out' | grep -qx 3"
check "bench train: summary line" grep -Eq "overlap: +[0-9.]+ ms per iteration \(median of 2\) +-> [0-9.]+x" "$TMP/out"
check "bench train JSON" python3 - "$TMP/train.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["command"] == "bench train" and r["deterministic"] and r["speedup"] > 0, r
its = r["iterations"]
assert [i["schedule"] for i in its] == ["N=1", "overlap"] * 3, its
assert [i["timed"] for i in its] == [False, False] + [True] * 4, its
assert "git_revision" in r["environment"] or "mpi" in r["environment"], r["environment"].keys()
PY
# --baseline FLAGS: any switchable setting against the run's own; with --deterministic both sides give the bits of a
# plain coc train run, so the loss curve is the same as without --baseline.
TINY_COMMON=(--train-iters 6 --num-layers 1 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --deterministic
  --no-progress --sequence-parallel --lr 1e-3 --min-lr 1e-4)
TINY_TRAIN=("${TINY_COMMON[@]}" --skip-pairs 1)
check "bench train --baseline alternates the baseline and the run" run_bench train "${TINY_TRAIN[@]}" \
  --coc-parallel-num 4 --baseline "--coc-parallel-num 2 --coc-comm-algo p2p" --json "$TMP/baseline.json"
check "bench train --baseline: each iteration says its side" bash -c \
  "grep -c '| baseline$' '$TMP/out' | grep -qx 3 && grep -c '| run$' '$TMP/out' | grep -qx 3"
check "bench train --baseline: summary names the baseline" grep -q "alternating the baseline (--coc-parallel-num 2" \
  "$TMP/out"
grep -o "loss [0-9.]*" "$TMP/out" | head -6 >"$TMP/baseline.losses"
timeout 300 "$LAUNCH" -n 2 -- "$COC" train "${TINY_COMMON[@]}" --sample-length 0 2>&1 |
  grep -o "loss [0-9.]*" | head -6 >"$TMP/plain.losses"
check "bench train --baseline: deterministic losses equal a plain coc train" bash -c \
  "[ \$(wc -l <'$TMP/baseline.losses') = 6 ] && cmp '$TMP/baseline.losses' '$TMP/plain.losses'"
check "bench train --baseline JSON" python3 - "$TMP/baseline.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["baseline"] == "--coc-parallel-num 2 --coc-comm-algo p2p", r["baseline"]
assert r["ms_per_iter_baseline"] > 0 and r["ms_per_iter_run"] > 0, r
assert [i["schedule"] for i in r["iterations"]] == ["baseline", "run"] * 3, r["iterations"]
PY
check "bench train --baseline switches the ring's second communicator (cp 2)" run_bench train "${TINY_TRAIN[@]}" \
  --tp 1 --context-parallel-size 2 --baseline "--use-cp-send-recv-overlap"
# The GEMM library switches per iteration too: in deterministic mode both sides train the same model, and the bits
# stay close (the two libraries round differently).
check "bench train --baseline switches the GEMM library" run_bench train "${TINY_TRAIN[@]}" --gemm-backend onednn \
  --baseline "--gemm-backend openblas"
check "bench train --baseline --gemm-backend: summary names it" grep -q "alternating the baseline (--gemm-backend openblas)" \
  "$TMP/out"
expect_error train_bad_gemm_backend "--gemm-backend: mkl not in" 2 -- train "${TINY_COMMON[@]}" --gemm-backend mkl
expect_error bench_train_baseline_not_switchable "--num-layers cannot change between iterations" 2 -- \
  bench train "${TINY_TRAIN[@]}" --baseline "--num-layers 3"
expect_error bench_train_baseline_unknown_flag "--baseline \"--bogus\"" 2 -- bench train "${TINY_TRAIN[@]}" \
  --baseline "--bogus"
expect_error bench_train_baseline_bad_value "must be >= 1 or auto" 2 -- bench train "${TINY_TRAIN[@]}" \
  --baseline "--coc-parallel-num 0"
expect_error bench_train_nothing_to_compare "nothing to compare" 2 -- bench train --coc-parallel-num 1
expect_error bench_train_no_pair "leaves no timed pair" 2 -- bench train --train-iters 3
expect_error bench_train_no_checkpoints "writes no checkpoint" 2 -- bench train --save "$TMP/ckpt"

# The cluster benchmark scripts refuse bad arguments with one line and exit 2 before any cluster comes up (which
# needs root; these checks do not).
script_error() {  # script_error NAME REGEX SCRIPT ARGS...
  local name="$1" pattern="$2" script="$3"; shift 3
  timeout 30 bash "$ROOT/bench/$script" "$@" >"$TMP/$name.out" 2>&1
  local rc=$?
  check "$name (exit $rc)" bash -c "[ $rc -eq 2 ] && [ \$(wc -l <'$TMP/$name.out') -eq 1 ] && grep -Eq -e '$pattern' '$TMP/$name.out'"
}
script_error e2e_repeat_zero "--repeat \\(0\\) must be >= 1" cluster_e2e.sh --repeat 0
script_error e2e_missing_value "--iters needs a value" cluster_e2e.sh --iters
script_error e2e_octal_looking "--iters \\(8\\) must be greater than --skip \\(9\\)" cluster_e2e.sh --iters 08 --skip 09
script_error e2e_no_timed_pair "leaves no timed pair of the alternating run" cluster_e2e.sh --iters 5 --skip-pairs 2
script_error e2e_skip_pairs_not_a_number "--skip-pairs must be a non-negative integer" cluster_e2e.sh --skip-pairs x
script_error e2e_coc_is_a_directory "is not an executable file" cluster_e2e.sh --coc "$TMP"
script_error e2e_json_in_missing_folder "does not exist or is not writable" cluster_e2e.sh --json "$TMP/no/x.json"
script_error overlap_unknown_mpi "--mpi must be openmpi or mpich" cluster_overlap.sh --mpi foo
script_error overlap_json_is_a_directory "is a directory; pass a file name" cluster_overlap.sh --json "$TMP"
finish
