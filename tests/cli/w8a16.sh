#!/usr/bin/env bash
# coc-test-timeout: 300
# `coc check --layer row --w8a16 ...`: the frozen row layer with an int8 weight against the fp64 reference on the
# dequantised weights, for every granularity, with the weight bytes printed (about 4× fewer); bad specs are one
# clear error line.
source "$(dirname "$0")/common.bash"
run() { timeout 120 "$LAUNCH" -n "$1" -- "$COC" check "${@:2}" >"$TMP/out" 2>&1; local rc=$?; cat "$TMP/out"; return $rc; }
check "w8a16 per-tensor, tp 2" run 2 --layer row --w8a16 per-tensor --m 100 --k 256 --n 96 --bias
check "w8a16 per-channel asymmetric, N=3" run 2 --layer row --w8a16 per-channel --w8a16-asymmetric --m 77 --k 300 --n 64 --coc-parallel-num 3
check "w8a16 per-group:64, k slice not a multiple of g" run 2 --layer row --w8a16 per-group:64 --m 64 --k 200 --n 48 --bias
check "w8a16 prints weight bytes about 4x smaller" grep -Eq "weight bytes per rank .*\((3\.[5-9]|4\.0)[0-9]*x smaller\)" "$TMP/out"
expect_error w8a16_group_not_multiple_of_32 "multiple of 32" 2 -- check --layer row --w8a16 per-group:48 --m 8 --k 256 --n 8
expect_error w8a16_group_not_below_k "less than every rank's k slice" 2 -- check --layer row --w8a16 per-group:128 --m 8 --k 256 --n 8
expect_error w8a16_bad_spec "per-tensor, per-channel or per-group" 2 -- check --layer row --w8a16 per-row
expect_error w8a16_needs_row_layer "applies to --layer row" 2 -- check --op matmul_all_reduce --w8a16 per-tensor
expect_error w8a16_no_sequence_parallel "without --sequence-parallel" 2 -- check --layer row --sequence-parallel --w8a16 per-tensor --k 256
finish
