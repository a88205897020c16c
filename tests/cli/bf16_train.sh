#!/usr/bin/env bash
# coc-test-timeout: 600
# 16-bit training (issue 35; docs/mixed-precision.md). --bf16: the start-up line says what runs in bf16; a
# checkpoint of fp32 master weights resumes bit for bit; under --deterministic the losses are bitwise equal across N
# and progress engines; coc check --train-steps --bf16 passes against N = 1, tp = 1 and the fp32 curve; bench train
# alternates --bf16 with --no-bf16 in one run. --fp16: the dynamic loss scale starts at 2^32, skips the overflowing
# steps (counted in the log line), falls, and the run learns; a constant --loss-scale stays; N = 1 and N = 3 give the
# same bits.
source "$(dirname "$0")/common.bash"
C=(--lr-warmup-iters 2 --lr-decay-iters 6 --sample-length 0 --no-progress --seq-length 64 --bf16)
losses() { grep -o "iteration *[0-9]*/ *[0-9]* | loss [0-9.]*" "$1" | sed 's/ \+/ /g'; }

timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 6 >"$TMP/straight" 2>"$TMP/straight.err"
check "the start-up line names the bf16 kernel" grep -q "precision: bf16 (GEMMs on oneDNN's .*bf16" "$TMP/straight.err"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 3 --save "$TMP/ck" >/dev/null 2>&1
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${C[@]}" --train-iters 6 --load "$TMP/ck" >"$TMP/resumed" 2>/dev/null
check "a bf16 run resumes bit for bit (iterations 4-6)" \
  bash -c "[ -s '$TMP/resumed' ] && diff <(grep -o 'iteration *[4-6]/.*| loss [0-9.]*' '$TMP/straight') <(grep -o 'iteration *[4-6]/.*| loss [0-9.]*' '$TMP/resumed')"

D=(--train-iters 4 --deterministic --sample-length 0 --no-progress --bf16 --log-interval 1)
for v in "--coc-parallel-num 1" "--coc-parallel-num 3 --coc-comm-algo p2p" "--comm-engine thread" "--coc-fused-kernel" \
         "--sequence-parallel" "--sequence-parallel --use-mc2"; do
  # shellcheck disable=SC2086
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${D[@]}" $v >"$TMP/d" 2>/dev/null
  losses "$TMP/d" > "$TMP/d.$(echo "$v" | tr -c 'a-z0-9' _)"
done
check "deterministic bf16 losses: N=1 = N=3 p2p = the thread engine" bash -c \
  "cd '$TMP' && [ -s d.__coc_parallel_num_1_ ] && cmp -s d.__coc_parallel_num_1_ d.__coc_parallel_num_3___coc_comm_algo_p2p_ && cmp -s d.__coc_parallel_num_1_ d.__comm_engine_thread_"
check "deterministic bf16 losses: the fused kernel = N=1, and MC2 = sequence parallelism's chunked ops" bash -c \
  "cd '$TMP' && cmp -s d.__coc_parallel_num_1_ d.__coc_fused_kernel_ && [ -s d.__sequence_parallel_ ] && cmp -s d.__sequence_parallel_ d.__sequence_parallel___use_mc2_"

# Under --bf16 the linear layers keep the rows they gather (X of QKV and gate_up) in bf16: the memory line's
# activations shrink against fp32's at the same shape.
act() { grep -m1 -o "activations [0-9.]* MiB" "$1" | awk '{print $2}'; }
M=(--train-iters 1 --sample-length 0 --no-progress --seq-length 64 --sequence-parallel)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${M[@]}" >"$TMP/m32" 2>&1
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${M[@]}" --bf16 --profile --profile-dir "$TMP/prof16" >"$TMP/m16" 2>&1
check "--bf16 keeps the gathered inputs in bf16: activations $(act "$TMP/m16") MiB < fp32's $(act "$TMP/m32") MiB" \
  python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if 0 < a < b else 1)" "$(act "$TMP/m16")" \
  "$(act "$TMP/m32")"
# The conversion passes are compute in the profile, not free time (docs/profiling.md).
check "the bf16 profile records the conversions as compute events" \
  bash -c "cat '$TMP'/prof16/*.json | grep -q '\"name\":\"fp32_to_bf16\",\"pid\":[0-9]*,\"tid\":1'"

# --grad-reduce-in-bf16 on dp 2: every strategy sums the same rounded gradients in rank order (bitwise under
# --deterministic), and the losses stay those of fp32 reduction within a few bf16 steps.
G=(--train-iters 4 --deterministic --sample-length 0 --no-progress --bf16 --log-interval 1 --tensor-model-parallel-size 1)
for v in "" "--grad-reduce-in-bf16" "--grad-reduce-in-bf16 --overlap-grad-reduce" \
         "--grad-reduce-in-bf16 --data-parallel-sharding-strategy optim_grads"; do
  # shellcheck disable=SC2086
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${G[@]}" $v >"$TMP/g" 2>/dev/null
  losses "$TMP/g" > "$TMP/g.$(echo "x$v" | tr -c 'a-z0-9' _)"
done
check "--grad-reduce-in-bf16: no_shard = the overlapped all-reduce = optim_grads, bitwise" bash -c \
  "cd '$TMP' && [ -s g.x__grad_reduce_in_bf16_ ] && cmp -s g.x__grad_reduce_in_bf16_ g.x__grad_reduce_in_bf16___overlap_grad_reduce_ && cmp -s g.x__grad_reduce_in_bf16_ g.x__grad_reduce_in_bf16___data_parallel_sharding_strategy_optim_grads_"
check "--grad-reduce-in-bf16: within 1e-2 of the fp32 reduction's losses" python3 - "$TMP/g.x_" "$TMP/g.x__grad_reduce_in_bf16_" <<'PY'
import sys
a, b = ([float(l.split()[-1]) for l in open(f) if l.strip()] for f in sys.argv[1:3])
assert len(a) == len(b) == 4, (a, b)
assert all(abs(x - y) <= 1e-2 * abs(x) for x, y in zip(a, b)), (a, b)
PY

timeout 300 "$LAUNCH" -n 2 -- "$COC" check --train-steps 6 --deterministic --bf16 --sequence-parallel \
  >"$TMP/check" 2>&1
rc=$?
check "coc check --train-steps --bf16 passes (exit $rc)" test $rc -eq 0
check "... and states the distance from fp32" grep -q "bf16 vs fp32: max relative loss difference" "$TMP/check"

timeout 300 "$LAUNCH" -n 2 -- "$COC" bench train --train-iters 6 --sample-length 0 --bf16 --baseline "--no-bf16" \
  >"$TMP/bench" 2>&1
check "bench train alternates --bf16 with --no-bf16" grep -q "baseline (--no-bf16)" "$TMP/bench"
F=(--train-iters 30 --sample-length 0 --no-progress --fp16 --log-interval 1 --deterministic)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${F[@]}" >"$TMP/fp16" 2>"$TMP/fp16.err"
check "fp16: the start-up line says the GEMMs convert" grep -q "precision: fp16 (no dot products in fp16" "$TMP/fp16.err"
check "fp16: overflowing steps are skipped and counted" grep -q "iteration        1/.*loss scale 4294967296.0 | number of skipped iterations 1 | grad norm nan" "$TMP/fp16"
check "fp16: the scale falls and steps resume" bash -c "grep '^ iteration' '$TMP/fp16' | tail -1 | grep -q 'number of skipped iterations [0-9]* | grad norm [0-9]'"
check "fp16: the run learns ($(losses "$TMP/fp16" | tail -1))" awk -v l="$(losses "$TMP/fp16" | tail -1 | awk '{print $NF}')" 'BEGIN { exit !(l < 4.0) }'
check "fp16: a skipped step holds the learning rate" bash -c "grep '^ iteration' '$TMP/fp16' | grep -A1 'grad norm nan' | grep -o 'lr [0-9.E+-]*' | uniq -c | awk '\$1 > 1' | grep -q ."
# Resuming at iteration 20 (after overflows, with the hysteresis spent) goes on with the scale, the skip count and
# the schedule: the last 10 iterations are the uninterrupted run's.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${F[@]}" --exit-interval 20 --save "$TMP/ck16" >/dev/null 2>&1
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${F[@]}" --load "$TMP/ck16" >"$TMP/fp16r" 2>/dev/null
check "fp16: a resumed run keeps the loss scale and schedule" bash -c "cmp -s <(grep '^ iteration' '$TMP/fp16' | tail -10 | grep -o 'loss [0-9.]* .*grad norm [0-9.na]*') <(grep '^ iteration' '$TMP/fp16r' | grep -o 'loss [0-9.]* .*grad norm [0-9.na]*')"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${F[@]}" --coc-parallel-num 3 >"$TMP/fp16n3" 2>/dev/null
check "fp16: N = 3 gives the bits of N = 4" bash -c "cmp -s <(grep -o 'loss [0-9.]* .*grad norm [0-9.na]*' '$TMP/fp16') <(grep -o 'loss [0-9.]* .*grad norm [0-9.na]*' '$TMP/fp16n3')"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${F[@]}" --loss-scale 1024 --train-iters 4 >"$TMP/fp16c" 2>/dev/null
check "fp16: a constant --loss-scale stays" bash -c "[ \$(grep -c 'loss scale 1024.0 | number of skipped iterations 0' '$TMP/fp16c') -eq 4 ]"
finish
