#!/usr/bin/env bash
# coc-test-timeout: 600
# `coc check`: ops and layers against the fp64 reference, and the loss-curve comparison (issue 2, "coc check").
source "$(dirname "$0")/common.bash"
run() { timeout 300 "$LAUNCH" -n "$1" -- "$COC" check "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "op matmul_reduce_scatter m=4097 N=3" run 2 --op matmul_reduce_scatter --m 4097 --k 512 --n 768 --coc-parallel-num 3
check "op all_gather_matmul_v2 k==n kn layout tp=3" run 3 --op all_gather_matmul_v2 --m 1000 --k 64 --n 64 --weight-layout kn --bias
check "layer column with sequence parallel" run 2 --layer column --sequence-parallel --m 1000 --k 128 --n 96 --bias
check "layer row with sequence parallel, m=1" run 2 --layer row --sequence-parallel --m 1 --k 64 --n 32 --bias --coc-parallel-num 8
check "train-steps 20: N=1 vs N=4 and tp=1 vs tp=2" run 2 --train-steps 20 --sequence-parallel --coc-parallel-num 4
check "train-steps deterministic: N=4 equals N=1 exactly" run 2 --train-steps 5 --sequence-parallel --use-deter-comp
check "train-steps tp=3 on 3 ranks: one automatic global batch for the tp=3 and tp=1 runs" \
  run 3 --train-steps 2 --tp 3 --ffn-hidden-size 510
check "op p2p deterministic tp=3 m=1000" run 3 --op matmul_reduce_scatter --m 1000 --k 64 --n 40 --coc-comm-algo p2p \
  --deterministic
run 2 --op matmul_all_reduce --m 256 --k 64 --n 64 --coc-parallel-num auto --coc-comm-algo p2p >/dev/null
check "auto is printed as N=auto, p2p only when it applies" bash -c "grep -q 'N=auto, weight .*bias off\$' '$TMP/out'"
check "tolerance failure exits non-zero" bash -c "! timeout 60 '$LAUNCH' -n 2 -- '$COC' check --op matmul_all_reduce --m 64 --k 64 --n 64 --rtol 0 >/dev/null 2>&1"
for op in matmul_all_reduce matmul_reduce_scatter all_gather_matmul_v2; do
  check "op $op --bf16 (bf16 wire) within the stated bound, tp=3 uneven m" \
    run 3 --op $op --bf16 --m 333 --k 500 --n 40 --bias --coc-parallel-num 3
  check "op $op --bf16 prints its bound" grep -q "output / bf16 bound .* ok" "$TMP/out"
done
check "op --bf16 deterministic p2p" run 2 --op matmul_reduce_scatter --bf16 --deterministic --coc-comm-algo p2p \
  --m 257 --k 64 --n 40
check "layer column --bf16 with sequence parallel, tp=3 uneven m, n" \
  run 3 --layer column --bf16 --sequence-parallel --m 101 --k 96 --n 50 --bias --coc-parallel-num 3
check "layer column --bf16 prints each bound" bash -c "grep -c '/ bf16 bound .* ok' '$TMP/out' | grep -qx 4"
check "layer row --bf16 p2p deterministic, m=1" \
  run 2 --layer row --bf16 --sequence-parallel --m 1 --k 64 --n 32 --coc-comm-algo p2p --deterministic
check "layer row --bf16, N=3" run 2 --layer row --bf16 --m 77 --k 129 --n 33 --coc-parallel-num 3
expect_error check_needs_a_mode "exactly one of" 2 -- check
finish
