#!/usr/bin/env bash
# coc-test-timeout: 300
# The fused node-shared kernels end to end (coc/overlap/fused_ops.h): `coc check --op OP --coc-fused-kernel` on the
# awkward shapes, `coc check --layer ... --use-mc2`, `--train-steps` fused against unfused (bitwise with
# --deterministic), the flag validation, and reliability: a rank SIGKILLed inside a fused kernel
# (COC_TEST_FUSED_KILL_RANK) ends the job with an error within the deadline, and no shared-memory file of ours is
# left in /dev/shm after success, error or kill.
source "$(dirname "$0")/common.bash"

# Files in /dev/shm now, minus those of other jobs that come and go (vader segments of concurrent runs).
shm_list() { ls /dev/shm 2>/dev/null | sort; }
shm_before=$(shm_list)

for op in matmul_all_reduce matmul_reduce_scatter all_gather_matmul all_gather_matmul_v2; do
  passes_check "fused_${op}_uneven" 2 -- check --op "$op" --m 1001 --k 96 --n 80 --bias --coc-fused-kernel
  passes_check "fused_${op}_m1_kn" 2 -- check --op "$op" --m 1 --k 64 --n 64 --weight-layout kn --coc-fused-kernel
done
passes_check fused_rs_tp4_m_lt_tp 4 -- check --op matmul_reduce_scatter --m 3 --k 40 --n 24 --coc-fused-kernel
passes_check fused_ar_tp2_dp2 4 -- check --op matmul_all_reduce --tp 2 --m 77 --k 64 --n 48 --bias --coc-fused-kernel
passes_check mc2_column 2 -- check --layer column --sequence-parallel --use-mc2 --m 257 --k 64 --n 96 --bias
passes_check mc2_row 2 -- check --layer row --sequence-parallel --use-mc2 --m 257 --k 64 --n 96 --bias
passes_check mc2_column_frozen 2 -- check --layer column --sequence-parallel --use-mc2 --frozen-weight --m 99 --k 48 --n 48
passes_check fused_kernel_row_no_sp 2 -- check --layer row --coc-fused-kernel --m 99 --k 48 --n 48 --bias

# Training: fused against unfused; deterministic mode must agree bitwise (tolerance 0).
passes_check train_fused_det 2 -- check --train-steps 3 --coc-fused-kernel --deterministic --sequence-parallel --micro-batch-size 2
passes_check train_mc2 2 -- check --train-steps 3 --use-mc2 --sequence-parallel --micro-batch-size 2
check "train fused det: 0 difference to unfused" grep -q "fused vs unfused: max relative loss difference 0.000e+00" \
  "$TMP/train_fused_det.out"

# -v says which path ran.
timeout 60 "$LAUNCH" -n 2 -- "$COC" check --op matmul_reduce_scatter --m 64 --k 32 --n 32 --coc-fused-kernel -v \
  >"$TMP/verbose.out" 2>"$TMP/verbose.err"
check "verbose names the fused kernel" grep -q "fused kernel over node-shared memory" "$TMP/verbose.err"

expect_error both_modes "cannot be combined" 2 -- check --layer row --sequence-parallel --coc-fused-kernel --use-mc2
expect_error mc2_needs_sp "--use-mc2 requires --sequence-parallel" 2 -- check --layer row --use-mc2
expect_error train_mc2_needs_sp "--use-mc2 requires --sequence-parallel" 2 -- train --use-mc2 --no-sequence-parallel --train-iters 1

# A rank killed inside a fused kernel: the job must end non-zero well within the deadline (mpirun notices the
# dead rank; the waiting rank's own flag deadline, 6 s here, is the backstop), never hang.
start=$SECONDS
COC_TEST_FUSED_KILL_RANK=1 timeout 60 "$LAUNCH" -n 2 -- "$COC" check --op matmul_reduce_scatter --m 2048 --k 256 \
  --n 256 --coc-fused-kernel --distributed-timeout-minutes 0.1 >"$TMP/kill.out" 2>"$TMP/kill.err"
rc=$?
took=$((SECONDS - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 40 ]; then
  echo "ok   killed rank ends the job: exit $rc after $took s"; passes=$((passes + 1))
else
  echo "FAIL killed rank: exit $rc after $took s"; sed 's/^/    /' "$TMP/kill.err" | head -20; fails=$((fails + 1))
fi
check "kill: stderr says what happened" grep -Eqi "kill|signal|coc: error" "$TMP/kill.err"

# A rank that stops (SIGSTOP) inside a fused kernel is invisible to mpirun: the waiting rank's own flag deadline
# (6 s here) must fire, name the wait, and abort the job (timeout exit code 4).
start=$SECONDS
COC_TEST_FUSED_STOP_RANK=1 timeout 60 "$LAUNCH" -n 2 -- "$COC" check --op matmul_all_reduce --m 2048 --k 256 \
  --n 256 --coc-fused-kernel --distributed-timeout-minutes 0.1 >"$TMP/stop.out" 2>"$TMP/stop.err"
rc=$?
took=$((SECONDS - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 40 ]; then
  echo "ok   stopped rank: the waiter's deadline ends the job: exit $rc after $took s"; passes=$((passes + 1))
else
  echo "FAIL stopped rank: exit $rc after $took s"; sed 's/^/    /' "$TMP/stop.err" | head -20; fails=$((fails + 1))
fi
check "stop: the waiting rank names the shared-memory wait" grep -q "coc: error: \[rank 0\].*waited .* ms for rank 1" \
  "$TMP/stop.err"
check "stop: the rank is named once" bash -c "! grep -Eq '\[rank ([0-9]+)\] rank \1:' '$TMP/stop.err'"

# Nothing of ours left in /dev/shm: Open MPI's osc/sm window files are named osc_sm.* (other helpers' and other
# jobs' files come and go on a shared machine, so only names that can be ours count).
sleep 1
leftover=$(comm -13 <(echo "$shm_before") <(shm_list) | grep -E 'osc|coc_shm|mpi_win' || true)
check "no coc/osc shared-memory file left in /dev/shm" test -z "$leftover"
[ -n "$leftover" ] && echo "    left: $leftover"
finish
