#!/usr/bin/env bash
# coc-test-timeout: 240
# MindSpeed's flags (src/cli/train_mindspeed_flags.h): a MindSpeed-style argument list runs unchanged; --coc-mode 1
# (and 0) gives bitwise the losses of --coc-parallel-num 1 and runs N = 1 (no overlap), --coc-mode 2 runs CoC; each
# NPU-kernel flag gets a one-line note; --norm-epsilon, --rotary-base and --init-method-std take effect;
# --profile-save-path is --profile-dir; unknown flags and bad values still fail with one line.
source "$(dirname "$0")/common.bash"
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress)

# As a MindSpeed launch script writes it (pretrain_gpt.py's flags that coc implements), unchanged.
MINDSPEED=(--tensor-model-parallel-size 2 --sequence-parallel --use-ascend-coc --coc-parallel-num 4 --coc-mode 2
           --use-fused-rmsnorm --use-fused-swiglu --use-fused-rotary-pos-emb --use-flash-attn
           --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --seq-length 32
           --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 1
           --lr-decay-iters 3 --weight-decay 1e-1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
           --init-method-std 0.01 --norm-epsilon 1e-5 --rotary-base 10000 --seed 42 --log-interval 1
           --distributed-timeout-minutes 5 --use-deter-comp)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${MINDSPEED[@]}" --sample-length 0 --no-progress \
  >"$TMP/ms.out" 2>"$TMP/ms.err"
rc=$?
check "the MindSpeed-style argument list runs (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -3 "$TMP/ms.err"
check "it runs CoC with N = 4 (--coc-mode 2)" grep -q -- "--coc-parallel-num 4 (collective) (deterministic)" "$TMP/ms.err"
check "one note per NPU-kernel flag" test "$(grep -c 'note: --use-\(fused-rmsnorm\|fused-swiglu\|fused-rotary-pos-emb\|flash-attn\): selects an Ascend kernel' "$TMP/ms.err")" -eq 4
check "three iterations logged" test "$(grep -c '^ iteration' "$TMP/ms.out")" -eq 3

# --coc-mode 0/1: the same losses as N = 1, bit for bit, and N = 1 is what runs.
losses() {  # losses NAME FLAGS...: the run's losses, one per line, from --log-json
  local name="$1"; shift
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 4 --deterministic "${SMALL[@]}" "$@" \
    --log-json "$TMP/$name.jsonl" >"$TMP/$name.out" 2>"$TMP/$name.err" || echo "run $name failed"
  python3 -c 'import json, sys; [print(repr(r["loss"])) for r in map(json.loads, open(sys.argv[1])) if r["type"] == "iteration"]' \
    "$TMP/$name.jsonl"
}
n1=$(losses n1 --coc-parallel-num 1)
mode1=$(losses mode1 --use-ascend-coc --coc-mode 1 --coc-parallel-num 4)
mode0=$(losses mode0 --coc-mode 0)
mode2=$(losses mode2 --use-ascend-coc --coc-mode 2 --coc-parallel-num 4)
check "four losses from N = 1" test "$(echo "$n1" | grep -c .)" -eq 4
check "--coc-mode 1 gives the losses of N = 1 bit for bit" test "$mode1" = "$n1"
check "--coc-mode 0 too" test "$mode0" = "$n1"
check "--coc-mode 1 runs N = 1, no overlap" grep -q -- "--coc-parallel-num 1 (collective)" "$TMP/mode1.err"
check "--coc-mode 2 runs N = 4" grep -q -- "--coc-parallel-num 4 (collective)" "$TMP/mode2.err"
check "--coc-mode 2 (deterministic) has the same losses as well" test "$mode2" = "$n1"

# The model flags reach the model: another init std changes the first loss.
std=$(losses std --init-method-std 0.05 --coc-parallel-num 1)
check "--init-method-std changes the losses" test "$std" != "$n1"
eps=$(losses eps --norm-epsilon 0.5 --coc-parallel-num 1)
check "--norm-epsilon changes the losses" test "$eps" != "$n1"
rope=$(losses rope --rotary-base 100 --coc-parallel-num 1)
check "--rotary-base changes the losses" test "$rope" != "$n1"

# --profile-save-path is MindSpeed's name of --profile-dir.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 2 "${SMALL[@]}" --profile --profile-save-path "$TMP/prof" \
  >/dev/null 2>&1
check "--profile-save-path DIR writes the trace into DIR" bash -c "ls '$TMP'/prof/coc_trace_*.json >/dev/null"

expect_error unknown_flag "argument was not expected: --use-ascend-cocx" 2 -- train --use-ascend-cocx
expect_error coc_mode_range "--coc-mode: Value 3 not in range 0 to 2" 2 -- train --coc-mode 3
expect_error coc_mode_with_mc2 "--coc-mode 1 runs without overlap.*--use-ascend-mc2" 2 -- train --coc-mode 1 \
  --use-ascend-mc2
expect_error rotary_base "--rotary-base must be > 1 \(got 0\)" 2 -- train --rotary-base 0
expect_error init_std "--init-method-std must be a finite number >= 0 \(got -1\)" 2 -- train --init-method-std -1
finish
