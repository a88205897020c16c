#!/usr/bin/env bash
# coc-test-timeout: 600
# Context parallelism (issue 18): `coc check --op ring_attention` the ring against full fp64 attention on 2 and 3 ranks, both masks,
# the full-duplex switch, the double ring; `coc bench ring-attention`; `coc check --train-steps` with --context-parallel-size against cp = 1; and each refusal is one clear line with exit 2.
source "$(dirname "$0")/common.bash"
run() { timeout 120 "$LAUNCH" -n "$1" -- "$COC" check --op ring_attention "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "ring cp=2 causal" run 2 --seq-length 64 --num-attention-heads 2 --kv-channels 8
check "ring cp=3 general, send/recv overlap" run 3 --seq-length 66 --num-attention-heads 3 --kv-channels 4 \
  --attention-mask-type general --use-cp-send-recv-overlap
check "ring cp=2 inside tp=2 on 4 ranks" run 4 --tp 2 --context-parallel-size 2 --seq-length 32 --micro-batch-size 2
check "the summary names the layout" bash -c "grep -q 'cp=2 (tp=2, dp=1)' '$TMP/out'"
bench() { timeout 120 "$LAUNCH" -n "$1" -- "$COC" bench ring-attention "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "bench ring-attention cp=3 (odd ring, both communicator modes)" bench 3 --seq-length 66 --num-attention-heads 2 \
  --kv-channels 8 --reps 1 --warmup 0 --json "$TMP/ring.json"
check "bench json has the four variants" python3 -c "import json,sys; j=json.load(open('$TMP/ring.json')); sys.exit(len(j['rows']) != 4 or 'hidden' not in j['rows'][1])"
check "bench ring-attention with the thread engine" bench 2 --seq-length 64 --num-attention-heads 2 --kv-channels 8 \
  --reps 1 --warmup 0 --comm-engine thread
check "bench ring-attention names its engine" grep -q "thread engine" "$TMP/out"
expect_error bench_ring_bad_seq "seq-length 102 does not divide into 2·CP = 4 .*use 100 or 104" 2 -- \
  bench ring-attention --seq-length 102
# Training with context parallelism matches cp = 1 (the reference run of --train-steps), also with tp 2 and SP.
# Memory: attention holds blocks of S / CP rows, never a whole-sequence score matrix, so its resident growth per
# rank falls as 1 / CP (bench ring-attention's "attention memory per rank" line, peak resident growth).
mem() { bench "$1" --seq-length 4096 --num-attention-heads 1 --kv-channels 64 --reps 1 --warmup 0 >/dev/null &&
  grep -o "attention memory per rank: [0-9.]*" "$TMP/out" | grep -o "[0-9.]*$"; }
m1=$(mem 1) m2=$(mem 2)
check "attention memory per rank halves from cp=1 ($m1 MiB) to cp=2 ($m2 MiB), far below a 64 MiB score matrix" \
  awk -v a="$m1" -v b="$m2" 'BEGIN { exit !(a > 0 && b > 0 && b < 0.65 * a && a < 48) }'
trainsteps() { timeout 300 "$LAUNCH" -n "$1" -- "$COC" check --train-steps "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "train-steps 20, cp=2 matches cp=1" trainsteps 2 20 --context-parallel-size 2 --tp-rtol 1e-5
# The ring's last dK, dV hop runs the delayed weight gradients (gate/up's and proj's at tp 1): only their timing
# changes, so the deterministic losses equal those of --no-delay-wgrad-compute in every printed digit (-v: 17).
cplosses() { timeout 300 "$LAUNCH" -n 2 -- "$COC" train --context-parallel-size 2 --deterministic --train-iters 3 \
  --seq-length 64 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --sample-length 0 -v "$@" 2>&1 |
  grep -o "rank 0\].*iteration [0-9]*: .*loss [0-9.e+-]*" | sed 's/.*loss //'; }
l_on=$(cplosses) l_off=$(cplosses --no-delay-wgrad-compute)
check "cp=2: weight gradients under the last hop give the same losses ($(echo $l_on | cut -c1-40)...)" \
  test -n "$l_on" -a "$l_on" = "$l_off"
check "train-steps 10, tp=2 cp=2 with SP and send/recv overlap matches tp=1 cp=1" \
  trainsteps 4 10 --tp 2 --context-parallel-size 2 --sequence-parallel --use-cp-send-recv-overlap --tp-rtol 1e-5
expect_error train_seq_not_divisible "seq-length 130 does not divide into 2·CP = 4 .*use 128 or 132" 2 -- \
  train --context-parallel-size 2 --seq-length 130 --train-iters 1
expect_error train_cp_not_dividing "world size 2 is not divisible by --tensor-model-parallel-size 1 × --context-parallel-size 3 = 3" 2 -- \
  train --context-parallel-size 3 --tp 1 --train-iters 1
expect_error ring_seq_not_divisible "seq-length 100 does not divide into 2·CP = 6 .*use 96 or 102" 3 -- \
  check --op ring_attention --seq-length 100
check "exit 2 for a bad sequence length" test "$last_rc" -eq 2
expect_error ring_cp_not_dividing_world "context-parallel-size 3 × --tp 1 must divide the world size 2" 2 -- \
  check --op ring_attention --context-parallel-size 3
check "exit 2 for a cp that does not divide the world" test "$last_rc" -eq 2
expect_error ring_window_not_dividing "cp-window-size 3 must be >= 1 and divide --context-parallel-size 2" 2 -- \
  check --op ring_attention --cp-window-size 3
check "exit 2 for a window that does not divide cp" test "$last_rc" -eq 2
check "double ring cp=4 w=2, send/recv overlap" run 4 --seq-length 40 --cp-window-size 2 --use-cp-send-recv-overlap
expect_error ring_flag_without_ring "--context-parallel-size applies to --op ring_attention and --train-steps only" 2 -- \
  check --op matmul_all_reduce --context-parallel-size 2
# Flags the ring check would ignore (it runs multi-head attention of its own shapes) are refused, not PASSED.
expect_error ring_gqa "--op ring_attention does not take --group-query-attention" 2 -- \
  check --op ring_attention --group-query-attention --num-query-groups 2
expect_error ring_groups "--op ring_attention does not take --num-query-groups" 2 -- \
  check --op ring_attention --num-query-groups 2
expect_error ring_m "--op ring_attention does not take --m" 2 -- check --op ring_attention --m 64
finish
