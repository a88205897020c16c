#!/usr/bin/env bash
# coc-test-timeout: 600
# Bad input gets one clear error line naming the problem and the fix, a non-zero exit, and no hang (issue 2).
source "$(dirname "$0")/common.bash"
T=(--train-iters 2 --sample-length 0 --no-progress)

# Megatron's precision flags (cli/train_precision_flags.h): the meaningless combinations, what is not built (the bf16
# gradient reduction), and bad loss-scaling values.
expect_error bf16_with_fp16 "--bf16 and --fp16 together: choose one" 2 -- train "${T[@]}" --bf16 --fp16
expect_error loss_scale_without_fp16 "--loss-scale 128 has no meaning without --fp16" 2 -- train "${T[@]}" --loss-scale 128
expect_error hysteresis_with_bf16 "--hysteresis 2 has no meaning without --fp16" 2 -- train "${T[@]}" --bf16 --hysteresis 2
expect_error grad_reduce_in_bf16_alone "--grad-reduce-in-bf16 needs --bf16" 2 -- train "${T[@]}" --grad-reduce-in-bf16
expect_error fp32_residual_alone "--fp32-residual-connection needs --bf16" 2 -- train "${T[@]}" --fp32-residual-connection
expect_error loss_scale_window_zero "--loss-scale-window 0 must be >= 1" 2 -- train "${T[@]}" --fp16 --loss-scale-window 0
expect_error loss_scale_not_a_number "--loss-scale 'big' is not a number" 2 -- train "${T[@]}" --fp16 --loss-scale big
expect_error hysteresis_fraction "--hysteresis '1.5' counts steps: give a whole number" 2 -- train "${T[@]}" --fp16 --hysteresis 1.5
expect_error loss_scale_window_fraction "--loss-scale-window '2.7' counts steps" 2 -- train "${T[@]}" --fp16 --loss-scale-window 2.7
expect_error loss_scale_beyond_fp32 "--loss-scale 1e\+40 must be a number from fp32's smallest normal value" 2 -- train "${T[@]}" --fp16 --loss-scale 1e40
expect_error loss_scale_below_fp32 "--loss-scale 1e-40 must be a number from" 2 -- train "${T[@]}" --fp16 --loss-scale 1e-40
expect_error loss_scale_value_missing "--hysteresis takes a number, not '--fp16': give --hysteresis a value before --fp16" 2 -- train "${T[@]}" --hysteresis --fp16
expect_error loss_scale_window_huge "--loss-scale-window '1e20' counts steps: give a whole number below 1e15" 2 -- train "${T[@]}" --fp16 --loss-scale-window 1e20
expect_error integer_out_of_range "--seq-length 99999999999999999999 is out of range" 2 -- train "${T[@]}" --seq-length 99999999999999999999
expect_error min_above_initial "--min-loss-scale 1000000 is above --initial-loss-scale 1024" 2 -- train "${T[@]}" --fp16 --initial-loss-scale 1024 --min-loss-scale 1e6
expect_error coc_parallel_num_zero "coc-parallel-num.*must be >= 1" 2 -- train "${T[@]}" --coc-parallel-num 0
expect_error tp_not_dividing_heads "num-attention-heads 3 is not divisible by --tensor-model-parallel-size 2" 2 -- train "${T[@]}" --num-attention-heads 3 --tp 2
expect_error tp_not_dividing_ffn "ffn-hidden-size 512 is not divisible by --tensor-model-parallel-size 3" 3 -- train "${T[@]}" --tp 3
expect_error hidden_not_dividing_heads "hidden-size 130 is not divisible by --num-attention-heads 6" 2 -- train "${T[@]}" --hidden-size 130
expect_error world_not_divisible "world size 3 is not divisible by --tensor-model-parallel-size 2" 3 -- train "${T[@]}" --tensor-model-parallel-size 2
expect_error missing_data_path "data-path /nonexistent/text does not exist" 2 -- train "${T[@]}" --data-path /nonexistent/text
mkdir -p "$TMP/empty"
expect_error empty_data_path "no usable text|empty" 2 -- train "${T[@]}" --data-path "$TMP/empty"
printf 'short' > "$TMP/short.txt"
expect_error seq_length_longer_than_data "seq-length|shorter" 2 -- train "${T[@]}" --data-path "$TMP/short.txt"
expect_error batch_not_divisible "global-batch-size 6 is not divisible by --micro-batch-size 4" 2 -- train "${T[@]}" --global-batch-size 6
expect_error batch_does_not_fit "does not fit" 2 -- train "${T[@]}" --micro-batch-size 4096 --seq-length 8192 --global-batch-size 4096
expect_error unknown_engine "unknown --comm-engine" 2 -- train "${T[@]}" --comm-engine spin
expect_error unknown_flag "not expected" 2 -- train --no-such-flag
expect_error check_flag_in_train "--op is a flag of coc check" 2 -- train --op matmul_all_reduce
# A nested subcommand is checked against its own flags: --train-iters is bench train's too, --profile only train's.
expect_error train_flag_in_bench_train "--profile is a flag of coc train" 2 -- bench train --train-iters 2 --profile
expect_error bench_train_flag_in_bench "--skip-pairs is a flag of coc bench train" 2 -- bench --skip-pairs 2
printf 'lr: [oops\n' > "$TMP/bad.yaml"
expect_error bad_yaml "config" 2 -- train "${T[@]}" --config "$TMP/bad.yaml"
printf 'no-such-key: 1\n' > "$TMP/extra.yaml"
expect_error unknown_yaml_key "unknown key .no-such-key." 2 -- train "${T[@]}" --config "$TMP/extra.yaml"
printf 'lr: 0.001\nlr: 0.002\n' > "$TMP/twice.yaml"
expect_error yaml_key_twice "key 'lr' appears twice" 2 -- train "${T[@]}" --config "$TMP/twice.yaml"
expect_error w8a16_asymmetric_alone "--w8a16-asymmetric needs --w8a16" 2 -- check --layer row --w8a16-asymmetric
expect_error w8a16_with_train_steps "--w8a16 applies to --layer row only" 2 -- check --train-steps 1 --w8a16 per-tensor
expect_error check_train_iters "does not take --train-iters: it takes --train-steps K" 2 -- check --op matmul_all_reduce --train-iters 5
expect_error check_save "coc check does not take --save" 2 -- check --train-steps 2 --save "$TMP/never"
expect_error check_reference_batch "coc check's reference run at tp 1 .* cannot run the given shape: --global-batch-size 2" 2 -- \
  check --train-steps 1 --tp 2 --micro-batch-size 2 --global-batch-size 2
expect_error gqa_general_mask "--group-query-attention with --attention-mask-type general is not supported yet" 2 -- \
  train "${T[@]}" --hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2 \
  --attention-mask-type general
expect_error check_rtol_negative "--bf16-rtol must be a number >= 0 \(got -1\)" 2 -- check --train-steps 1 --bf16-rtol -1
expect_error check_tp_rtol_nan "--tp-rtol must be a number >= 0 \(got nan\)" 2 -- check --train-steps 1 --tp-rtol nan
# coc check's modes refuse the precision and tolerance flags they would ignore, and coc train's precision refusals.
O=(check --op matmul_all_reduce --m 8 --k 8 --n 8)
expect_error check_op_bf16_fp16 "check --op matmul_all_reduce: --fp16 applies to --train-steps only" 2 -- "${O[@]}" --bf16 --fp16
expect_error check_op_loss_scale "check --op matmul_all_reduce: --loss-scale applies to --train-steps only" 2 -- "${O[@]}" --loss-scale 4
expect_error check_steps_bf16_fp16 "--bf16 and --fp16 together" 2 -- check --train-steps 1 --bf16 --fp16
printf 'bf16: true\nexpert-model-parallel-size: 1\n' > "$TMP/bf16.yaml"
check "check_config_moe_ignored" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' check --op matmul_all_reduce --m 16 \
  --k 16 --n 16 --config '$ROOT/configs/moe.yaml' | grep -q PASSED"
check "check_config_bf16_moe_rtol" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' check --layer moe --m 16 --k 8 \
  --n 8 --config '$TMP/bf16.yaml' --rtol 1e-4 | grep -q PASSED"
expect_error check_config_bf16_rtol "check --op matmul_all_reduce --bf16: --rtol does not apply" 2 -- "${O[@]}" --config "$TMP/bf16.yaml" --rtol 1e-3
expect_error check_layer_fp16 "check --layer row: --fp16 applies to --train-steps only" 2 -- check --layer row --fp16
expect_error check_op_grad_reduce "--grad-reduce-in-bf16 applies to --train-steps only" 2 -- "${O[@]}" --bf16 --grad-reduce-in-bf16
expect_error check_moe_bf16 "--layer moe: --bf16 applies to the CoC ops and --layer column.row" 2 -- check --layer moe --bf16
expect_error check_w8a16_bf16 "--w8a16: --bf16 applies to" 2 -- check --layer row --w8a16 per-tensor --bf16
expect_error check_op_bf16_rtol "--bf16: --rtol does not apply" 2 -- "${O[@]}" --bf16 --rtol 0
expect_error check_op_tp_rtol "--tp-rtol applies to --train-steps only" 2 -- "${O[@]}" --tp-rtol 0.1
expect_error check_bf16_rtol_alone "--bf16-rtol bounds the --bf16 curve" 2 -- check --train-steps 1 --bf16-rtol 0.1
expect_error check_steps_op_shape "check --train-steps: --m applies to --op and --layer only" 2 -- check --train-steps 1 --m 64
expect_error check_steps_weight_layout "check --train-steps: --weight-layout applies to --op and --layer only" 2 -- check --train-steps 1 --weight-layout kn
expect_error check_layer_num_layers "check --layer column: --num-layers applies to --train-steps only" 2 -- check --layer column --num-layers 3
# CLI11's conversion errors name what the option takes, and a value that is the next flag.
expect_error value_missing "--seq-length takes one [A-Z]+, not '--bf16': give --seq-length a value before --bf16" 2 -- \
  train "${T[@]}" --seq-length --bf16
expect_error value_fraction "--train-iters takes one [A-Z]+, not '2.5'" 2 -- train --train-iters 2.5 --sample-length 0
expect_error value_repeated "--train-iters was given 2 times \\('1', '2.5'\\): the last one counts, and '2.5' is not one INT" 2 -- \
  train --train-iters 1 --train-iters 2.5 --sample-length 0
printf 'bf16:\n' > "$TMP/novalue.yaml"
expect_error yaml_key_without_value "key 'bf16' must have a single value ..bf16: VALUE" 2 -- train "${T[@]}" --config "$TMP/novalue.yaml"
# Empty numbers (CLI11 read them as 0 or as nothing), and values of the wrong kind in a config file.
expect_error empty_number "--train-iters was given an empty value: give it one INT" 2 -- train "${T[@]}" --train-iters ""
expect_error empty_float "--lr was given an empty value: give it one FLOAT" 2 -- train "${T[@]}" --lr ""
printf 'seq-length: ""\n' > "$TMP/empty.yaml"
expect_error yaml_empty_number "'seq-length' has an empty value: give it one INT, or remove the line" 2 -- \
  train "${T[@]}" --config "$TMP/empty.yaml"
printf 'bf16: maybe\n' > "$TMP/maybe.yaml"
expect_error yaml_switch_value "'bf16' is a switch: give it true or false, not 'maybe'" 2 -- train "${T[@]}" \
  --config "$TMP/maybe.yaml"
printf 'hidden-size: 192.5\n' > "$TMP/fraction.yaml"
expect_error yaml_fraction "'hidden-size' takes one INT, not '192.5'" 2 -- train "${T[@]}" --config "$TMP/fraction.yaml"
# A config file's fp16 turned off from the command line; the loss-scale values checked even where unused.
printf 'fp16: true\n' > "$TMP/fp16.yaml"
check "no_fp16_over_a_config_file" "$LAUNCH" -n 2 -- "$COC" train "${T[@]}" --config "$TMP/fp16.yaml" --no-fp16 --bf16
expect_error both_precisions_names_the_fix "--bf16 and --fp16 together.*--no-bf16 or --no-fp16 turns it off" 2 -- \
  train "${T[@]}" --config "$TMP/fp16.yaml" --bf16
expect_error unused_initial_scale "--initial-loss-scale 'abc' is not a positive number" 2 -- train "${T[@]}" \
  --initial-loss-scale abc
expect_error cp_short_form "--seq-length 30 .*context-parallel" 2 -- train "${T[@]}" --cp 2 --seq-length 30
check "num_query_groups_without_gqa_warns" bash -c "timeout 120 '$LAUNCH' -n 2 -- '$COC' train ${T[*]} \
  --num-query-groups 2 2>&1 | grep -q -- '--num-query-groups 2 has no effect without --group-query-attention'"
expect_error negative_seed "--seed: must be an integer from 0" 2 -- train "${T[@]}" --seed -1
expect_error seed_past_uint64 "--seed: must be an integer from 0" 2 -- train "${T[@]}" --seed 99999999999999999999
expect_error negative_warmup "--lr-warmup-iters: must be an integer >= 0" 2 -- train "${T[@]}" --lr-warmup-iters -7
expect_error customized_coc_directory "--customized-coc: .* is a directory" 2 -- train "${T[@]}" --customized-coc "@$TMP/empty"
expect_error check_shape_too_big "needs about .* GiB of buffers on this node" 2 -- check --op matmul_all_reduce --m 99999999999
expect_error check_shape_past_vector_size "needs about .* GiB" 2 -- check --op all_gather_matmul --m 2000000000 --k 2000000000 --n 2

# Ranks launched with different flags: caught before the first collective, not a hang.
start=$SECONDS
mpmd -n 1 "$COC" train "${T[@]}" --seq-length 64 : \
  -n 1 "$COC" train "${T[@]}" --seq-length 32 >"$TMP/mpmd.out" 2>"$TMP/mpmd.err"
rc=$?
check "different_flags_per_rank (exit $rc, $((SECONDS - start)) s)" \
  bash -c "[ $rc -ne 0 ] && grep -q 'ranks disagree on the training configuration' '$TMP/mpmd.err'"
check "different_flags_per_rank: the flag is named" grep -q "differs from rank 0 in .*--seq-length (rank 0: 64, rank 1: 32)" \
  "$TMP/mpmd.err"
# Flags that the agreement once missed: the metrics' communicator made on one rank only (a hang), the bf16 gradient
# reduction (a heap corruption inside Open MPI), sampling and checkpoints (a collective timeout). Each must end at
# once, naming the flag.
disagree() {  # disagree NAME EXPECTED_FLAG_REGEX "RANK0 FLAGS" "RANK1 FLAGS"
  local name="$1" flag="$2" a="$3" b="$4" start=$SECONDS
  # shellcheck disable=SC2086
  mpmd -n 1 "$COC" train "${T[@]}" --distributed-timeout-minutes 1 $a : \
    -n 1 "$COC" train "${T[@]}" --distributed-timeout-minutes 1 $b >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  check "$name: exit 2 at once, naming $flag (exit $rc, $((SECONDS - start)) s)" \
    bash -c "[ $rc -eq 2 ] && [ $((SECONDS - start)) -lt 30 ] && grep -q 'differs from rank 0 in $flag' '$TMP/$name.err'"
}
disagree disagree_log_json "--log-json (rank 0: off, rank 1: on)" "" "--log-json $TMP/one.jsonl"
disagree disagree_log_interval "--log-interval, with --log-json or --tensorboard-dir (rank 0: 2, rank 1: 3)" "--log-json $TMP/li.jsonl --log-interval 2" "--log-json $TMP/li.jsonl --log-interval 3"
disagree disagree_grad_reduce "--grad-reduce-in-bf16" "--tp 1 --bf16" "--tp 1 --bf16 --grad-reduce-in-bf16"
disagree disagree_sample "--sample-length" "--sample-length 4" "--sample-length 0"
disagree disagree_save "--save" "" "--save $TMP/one_rank_ckpt"
disagree disagree_optimizer "--weight-decay (rank 0: 0.5, rank 1: 0.1)" "--weight-decay 0.5" ""
# The flags typed come before what follows from them, values as typed, and the count of the rest.
disagree disagree_order "--seed (rank 0: 1, rank 1: 2); --coc-parallel-num (rank 0: 4, rank 1: auto); --lr-decay-style (rank 0: linear, rank 1: cosine)\. Launch" \
  "--seed 1 --coc-parallel-num 4 --lr-decay-style linear" "--seed 2 --coc-parallel-num auto"
disagree disagree_more "--num-layers (rank 0: 1, rank 1: 2); --hidden-size (rank 0: 96, rank 1: 192); --ffn-hidden-size (rank 0: 128, rank 1: 512) and 1 more\." \
  "--num-layers 1 --hidden-size 96 --ffn-hidden-size 128 --bf16" "--num-layers 2"
disagree disagree_save_path "--save (rank 0: $TMP/save_a, rank 1: $TMP/save_b)" "--save $TMP/save_a" "--save $TMP/save_b"
disagree disagree_model "--num-layers (rank 0: 1, rank 1: 2)" "--num-layers 1" "--num-layers 2"
disagree disagree_overlap "--swiglu-down-backward-pipeline (rank 0: false, rank 1: true)" \
  "--no-swiglu-down-backward-pipeline" "--swiglu-down-backward-pipeline"
disagree disagree_debug_collectives "--debug-collectives" "--debug-collectives" ""
# A flag only one rank cannot parse: that rank's error ends the job (the others were waiting for it).
start=$SECONDS
mpmd -n 1 "$COC" train "${T[@]}" --bogus-flag : -n 1 "$COC" train "${T[@]}" >"$TMP/bogus.out" 2>"$TMP/bogus.err"
rc=$?
check "parse error on one rank: the job ends, naming it (exit $rc, $((SECONDS - start)) s)" \
  bash -c "[ $rc -ne 0 ] && [ $((SECONDS - start)) -lt 45 ] && grep -q 'coc: error: .*argument was not expected: --bogus-flag' '$TMP/bogus.err'"

# Shapes that differ across ranks inside an op: the debug fingerprint check names the mismatch.
mpmd -n 1 "$COC" check --op matmul_all_reduce --m 64 --k 16 --n 8 \
  --debug-collectives : -n 1 "$COC" check --op matmul_all_reduce --m 65 --k 16 --n 8 --debug-collectives \
  >"$TMP/fp.out" 2>"$TMP/fp.err"
rc=$?
check "fingerprint_mismatch (exit $rc)" bash -c "[ $rc -ne 0 ] && grep -Eq 'collective mismatch|ranks disagree' '$TMP/fp.err'"
[ $rc -ne 0 ] && grep "coc: error" "$TMP/fp.err" | head -1 | cut -c1-200

# Output hygiene under a bare launcher: Open MPI gives ranks pseudo-terminals even when the output is a file, so no
# progress bar may be drawn there; and the sample of an untrained byte-level model (any bytes) is escaped, except
# for whole UTF-8 characters.
mpmd -n 2 "$COC" train --train-iters 1 --sample-length 300 --log-interval 1 >"$TMP/bare.out" 2>&1
rc=$?
check "bare_launcher_run (exit $rc)" [ $rc -eq 0 ]
check "bare_launcher_log_has_no_escapes" bash -c "! grep -q \$'\\033' '$TMP/bare.out'"
# Whole UTF-8 characters pass (a Chinese or accented corpus stays readable); control and stray bytes are escaped.
check "sample_has_no_control_bytes" /usr/bin/python3 -c "
import sys, unicodedata
t = open(sys.argv[1], 'rb').read().split(b'--- sample ---')[1].split(b'\n------')[0].decode('utf-8')
sys.exit(1 if any(unicodedata.category(ch) == 'Cc' and ch not in '\n\t' for ch in t) else 0)" "$TMP/bare.out"

# A corrupt checkpoint is refused with its path, not loaded.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${T[@]}" --save "$TMP/ckpt" >/dev/null 2>&1
# Every rank sees the same mismatch: one line (a uniform error), quoting both runs' model flags.
expect_error checkpoint_other_model "different model config .*saved with: .*--hidden-size 192.*this run: .*--hidden-size 240" 2 -- train "${T[@]}" --train-iters 4 --hidden-size 240 --load "$TMP/ckpt"
check "checkpoint_other_model_exit_2 (got $last_rc)" [ "$last_rc" -eq 2 ]
cp -r "$TMP/ckpt" "$TMP/ckpt_missing" && echo 99 > "$TMP/ckpt_missing/latest_checkpointed_iteration.txt"
expect_error checkpoint_missing_iteration "iter_0000099 does not exist" 2 -- train "${T[@]}" --train-iters 4 --load "$TMP/ckpt_missing"
check "checkpoint_missing_iteration_exit_3 (got $last_rc)" [ "$last_rc" -eq 3 ]
shard=$(ls "$TMP"/ckpt/iter_*/mp_rank_01_* 2>/dev/null | head -1)
if [ -n "$shard" ]; then
  size=$(stat -c %s "$shard")
  printf '\xff\xfe' | dd of="$shard" bs=1 seek=$((size / 2)) conv=notrunc status=none
  expect_error corrupt_checkpoint "corrupt" 2 -- train "${T[@]}" --train-iters 4 --load "$TMP/ckpt"
  check "corrupt_checkpoint_exit_3 (got $last_rc)" [ "$last_rc" -eq 3 ]
  # Cut in half: the safetensors header still parses, its tensors end past the file's end. The fix named is the
  # checkpoint's (an earlier iteration), not a safetensors file's.
  cp -r "$TMP/ckpt_missing" "$TMP/ckpt_cut" && cp "$TMP/ckpt/latest_checkpointed_iteration.txt" "$TMP/ckpt_cut/"
  cut_shard=$(ls "$TMP"/ckpt_cut/iter_*/mp_rank_01_* | head -1)
  truncate -s $((size / 2)) "$cut_shard"
  expect_error truncated_checkpoint "checkpoint .*mp_rank_01_dp_000.ckpt is not a valid safetensors file \\(truncated at byte [0-9]+ of [0-9]+\\); delete .*iter_0+2 and set .* to an earlier saved iteration" 2 -- \
    train "${T[@]}" --train-iters 4 --load "$TMP/ckpt_cut"
  check "truncated_checkpoint_exit_3 (got $last_rc)" [ "$last_rc" -eq 3 ]
else
  echo "FAIL corrupt_checkpoint: no checkpoint was written"; fails=$((fails + 1))
fi
finish
