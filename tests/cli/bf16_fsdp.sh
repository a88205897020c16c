#!/usr/bin/env bash
# coc-test-timeout: 900
# FSDP and ZeRO parameter all-gathers under --bf16 (issue 35; docs/mixed-precision.md): the parameters that only
# bf16 GEMMs read (the linear layers', the experts', the output layer's weights, the embedding table, whose lookup
# is stored in bf16) move as bf16, the rest (norms, the MoE router) as fp32. That changes no bit: every strategy
# gives no_shard's losses and gradient norms under --deterministic, at dp 2 and dp 3 (shards that do not divide the
# parameter sizes), dense and MoE; the profile's fsdp gathers of those weights carry half the bytes of an fp32 run's,
# the norms' and the router's the same; and a bf16 ZeRO checkpoint (written from the fp32 master shards) resumes
# bit for bit.
source "$(dirname "$0")/common.bash"
S=(--seq-length 64 --tp 1 --deterministic --bf16)
trainsteps() {  # trainsteps RANKS ARGS...: coc check --train-steps 6, its verdict lines
  timeout 300 "$LAUNCH" -n "$1" -- "$COC" check --train-steps 6 "${@:2}" >"$TMP/out" 2>&1
  local rc=$?; grep -E "vs no_shard|bf16 vs fp32|PASSED|FAIL|error" "$TMP/out"; return $rc
}
bitwise() {  # bitwise STRATEGY: both comparisons against no_shard ran and were exact
  grep -q "$1 vs no_shard: max relative loss difference 0.000e+00" "$TMP/out" &&
    grep -q "$1 vs no_shard: max relative gradient norm difference 0.000e+00" "$TMP/out"
}
for s in optim_grads_params optim; do
  check "dp 2, --bf16, $s: bf16 parameter gathers" trainsteps 2 "${S[@]}" --data-parallel-sharding-strategy "$s"
  check "... bitwise no_shard" bitwise "$s"
done
check "dp 3 (uneven shards), --bf16, optim_grads, 2 micro-batches per rank" \
  trainsteps 3 "${S[@]}" --data-parallel-sharding-strategy optim_grads --micro-batch-size 2 --global-batch-size 12
check "... bitwise no_shard" bitwise optim_grads
# MoE: the router is gathered in fp32 (a bf16 router would route other tokens than no_shard's fp32 one). ep 2 on 2
# ranks gathers the dense weights over dp 2; ep 1 gathers the experts over expert-dp 2 too.
for ep in 2 1; do
  check "tiny-moe ep $ep, --bf16, optim_grads_params" \
    trainsteps 2 --model-preset tiny-moe --expert-model-parallel-size "$ep" "${S[@]}" \
    --data-parallel-sharding-strategy optim_grads_params
  check "... bitwise no_shard" bitwise optim_grads_params
done

# Bytes: rank 0's fsdp all-gathers in one profiled iteration, per parameter, against the same run in fp32.
gathers() {  # gathers OUT ARGS...: "tag bytes" lines of rank 0's fsdp all-gathers
  local dir="$TMP/prof_$1"
  timeout 300 "$LAUNCH" -n 2 -- "$COC" train --seq-length 64 --tp 1 --train-iters 1 --sample-length 0 --no-progress \
    --profile --profile-dir "$dir" --data-parallel-sharding-strategy optim_grads_params "${@:2}" >"$dir.log" 2>&1 ||
    { echo "    coc train $* failed:"; tail -5 "$dir.log" | sed 's/^/      /'; }
  python3 - "$(ls "$dir"/coc_trace_*.json | head -1)" >"$TMP/$1" <<'PY'
import collections, json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
b = collections.Counter()
for e in ev:
    a = e.get("args", {})
    if e.get("pid") == 0 and e.get("ph") == "X" and str(a.get("tag", "")).startswith("fsdp all_gather "):
        b[a["tag"][len("fsdp all_gather "):]] += a["bytes"]
for k in sorted(b): print(k, b[k])
PY
}
halved() {  # halved FP32 BF16 PATTERN_HALVED: parameters matching the pattern halve, all others keep their bytes
  python3 - "$@" <<'PY'
import re, sys
f32, b16 = ({l.split()[0]: int(l.split()[1]) for l in open(f)} for f in sys.argv[1:3])
assert f32 and f32.keys() == b16.keys(), (f32, b16)
half = [k for k in f32 if re.search(sys.argv[3], k)]
assert half and len(half) < len(f32), half
for k in f32:
    want = f32[k] // 2 if k in half else f32[k]
    assert f32[k] > 0 and b16[k] == want, (k, f32[k], b16[k])
print(f"    {sum(f32.values())} -> {sum(b16.values())} bytes; halved {len(half)}, kept {len(f32) - len(half)}")
PY
}
gathers dense32
gathers dense16 --bf16
GEMM_ONLY='^(?!.*(layernorm|router)).*[.]weight$'  # every weight but the norms' and the router's
check "dense: the weights' and the embedding's gathers halve, the norms' stay" \
  halved "$TMP/dense32" "$TMP/dense16" "$GEMM_ONLY"
check "... the norms are among the gathers" grep -q "layernorm" "$TMP/dense16"
gathers moe32 --model-preset tiny-moe --expert-model-parallel-size 1
gathers moe16 --model-preset tiny-moe --expert-model-parallel-size 1 --bf16
check "MoE: the experts' gathers halve, the router's and the norms' stay" \
  halved "$TMP/moe32" "$TMP/moe16" "$GEMM_ONLY"
check "... the router is among the gathers" grep -q "router" "$TMP/moe16"

# Checkpoints hold the fp32 master weights: optim's full parameters hold bf16 values after its gather, and a
# checkpoint of them would change the resumed run's updates.
C=(--seq-length 64 --tp 1 --bf16 --lr-warmup-iters 2 --lr-decay-iters 6 --sample-length 0 --no-progress)
lines() { grep -o "iteration *[4-6]/.*| loss [0-9.]*.*grad norm [0-9.]*" "$1"; }
for s in optim optim_grads_params; do
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --data-parallel-sharding-strategy "$s" --train-iters 6 \
    >"$TMP/straight_$s" 2>/dev/null
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --data-parallel-sharding-strategy "$s" --train-iters 3 \
    --save "$TMP/ck_$s" >/dev/null 2>&1
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --data-parallel-sharding-strategy "$s" --train-iters 6 \
    --load "$TMP/ck_$s" >"$TMP/resumed_$s" 2>/dev/null
  lines "$TMP/straight_$s" >"$TMP/straight_$s.l"
  lines "$TMP/resumed_$s" >"$TMP/resumed_$s.l"
  check "$s, --bf16: resumes bit for bit (iterations 4-6: losses and grad norms)" \
    bash -c "[ \$(wc -l <'$TMP/resumed_$s.l') -eq 3 ] && cmp '$TMP/straight_$s.l' '$TMP/resumed_$s.l'"
done

# coc bench train --baseline --no-bf16 switches the gathers with the GEMMs: optim gathers the fp32 weights again
# before an fp32 iteration (whose GEMMs must not read the bf16 values the last bf16 step left), so both sides give
# no_shard's losses bit for bit.
bench() {  # bench STRATEGY: the iteration lines' losses of a deterministic bench train alternating the precisions
  timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train --seq-length 64 --tp 1 --train-iters 6 --sample-length 0 \
    --deterministic --bf16 --data-parallel-sharding-strategy "$1" --baseline "--no-bf16" >"$TMP/bench_$1" 2>&1
  grep -o "iteration *[0-9]*/.*| loss [0-9.]*.*grad norm [0-9.]*" "$TMP/bench_$1"
}
bench no_shard >"$TMP/bench_ns.l"
bench optim >"$TMP/bench_optim.l"
check "bench train alternates --bf16 with --no-bf16 under optim" grep -q "baseline (--no-bf16)" "$TMP/bench_optim"
check "... both sides bitwise no_shard's (losses, grad norms)" \
  bash -c "[ \$(wc -l <'$TMP/bench_optim.l') -eq 6 ] && cmp '$TMP/bench_ns.l' '$TMP/bench_optim.l'"
finish
