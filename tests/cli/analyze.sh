#!/usr/bin/env bash
# coc-test-timeout: 300
# `coc analyze` (issue 3): the table on the shared real traces, --json that parses, msprof-style --csv, --svg and
# --html files, one HTA anchor reproduced under --convention hta, no MPI needed, and bad input (truncated
# .json.gz, a non-trace file, a missing path, a folder with no traces) answered by one error line and a non-zero
# exit.
source "$(dirname "$0")/common.bash"
TRACES="$ROOT/../shared/traces"

# analyze_error NAME REGEX ARGS...: like expect_error, but `coc analyze` runs as one plain process (no launcher).
analyze_error() {
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$COC" analyze "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    echo "FAIL $name: exit $rc (expected a quick error)"; fails=$((fails + 1)); return
  fi
  if [ "$(grep -c 'coc: error:' "$TMP/$name.err")" -ne 1 ] || ! grep 'coc: error:' "$TMP/$name.err" | grep -Eq -e "$pattern"; then
    echo "FAIL $name: exit $rc, expected one error line matching /$pattern/:"; sed 's/^/    /' "$TMP/$name.err"
    fails=$((fails + 1)); return
  fi
  if [ -s "$TMP/$name.out" ]; then
    echo "FAIL $name: printed output besides the error:"; head -5 "$TMP/$name.out" | sed 's/^/    /'
    fails=$((fails + 1)); return
  fi
  echo "ok   $name: exit $rc: $(grep 'coc: error:' "$TMP/$name.err" | cut -c1-160)"
  passes=$((passes + 1))
}

# ---- bad input (needs no shared traces) ------------------------------------------------------------------------
analyze_error missing_path "no such file" "$TMP/nope.json.gz"
mkdir -p "$TMP/empty"; echo hello > "$TMP/empty/readme.txt"
analyze_error folder_without_traces "no trace|no .*json" "$TMP/empty"
printf 'this is not a trace\n' > "$TMP/notes.json"
analyze_error non_trace_file "notes.json.*byte [0-9]+" "$TMP/notes.json"
printf '{"traceEvents":[{"ph":"X","name":"k","ts":1,"dur":2},' | gzip > "$TMP/truncated.json.gz"
analyze_error truncated_json "truncated.json.gz.*byte [0-9]+" "$TMP/truncated.json.gz"
analyze_error bad_rank_map "rank-map" "$TMP/notes.json" --rank-map "$TMP/notes.json=x"
analyze_error bad_convention "convention" "$TMP/notes.json" --convention nvidia

if [ ! -d "$TRACES/kineto" ]; then
  echo "skip: $TRACES/kineto not found (the shared real traces); only the bad-input checks ran"
  finish; exit $?
fi
K="$TRACES/kineto"
# A gzip stream cut in the middle: the error must name the file and a byte offset, and no table may appear.
head -c 300000 "$K/nccl_2rank_rank0/nccl_data.json.gz" > "$TMP/cut.json.gz"
analyze_error truncated_gzip "cut.json.gz.*byte [0-9]+" "$TMP/cut.json.gz"

# ---- the table on real traces, without mpirun and without MPI_Init ---------------------------------------------
start=$SECONDS
env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM timeout 120 "$COC" analyze "$K/sampled_2rank" \
  >"$TMP/table.out" 2>"$TMP/table.err"
rc=$?
check "table_sampled_2rank (exit $rc, $((SECONDS - start)) s)" \
  bash -c "[ $rc -eq 0 ] && grep -q '^rank 0' '$TMP/table.out' && grep -q '^rank 1' '$TMP/table.out' && grep -q 'overlap%' '$TMP/table.out'"
check "table_has_rank_balance" grep -q "rank balance" "$TMP/table.out"
check "no_mpi_banner" bash -c "! grep -qi 'mpi' '$TMP/table.err'"
sed -n 1,12p "$TMP/table.out"

# A CPU-only Kineto trace: no device activity as HTA sees it; coc's own CPU analysis otherwise (analyze_torch_cpu.sh).
timeout 120 "$COC" analyze --convention hta "$K/cpu_only" >"$TMP/cpu.out" 2>&1
check "cpu_only_no_device_activity under --convention hta (exit $?)" grep -q "no device activity" "$TMP/cpu.out"
timeout 120 "$COC" analyze "$K/cpu_only" >"$TMP/cpu.out" 2>&1
check "cpu_only analysed as torch-cpu (exit $?)" grep -q "(torch-cpu)" "$TMP/cpu.out"

# All shared traces at once: every file gives a rank section or a clear refusal, never a crash.
timeout 200 "$COC" analyze "$K"/*/ --rank-map "$K/distributed_info_unavailable/distributed_info_not_found.json.gz=900" \
  >"$TMP/all.out" 2>"$TMP/all.err"
rc=$?
check "all_shared_traces (exit $rc)" bash -c "[ $rc -eq 0 ] || { [ $rc -eq 2 ] && grep -q 'duplicate rank' '$TMP/all.err'; }"
[ $rc -ne 0 ] && sed 's/^/    /' "$TMP/all.err" | head -3

# ---- --json, --csv, --svg, --html ------------------------------------------------------------------------------
timeout 120 "$COC" analyze "$K/sampled_2rank" --json "$TMP/r.json" --csv "$TMP/r.csv" --svg "$TMP/r.svg" \
  --html "$TMP/r.html" -q >"$TMP/files.out" 2>&1
rc=$?
check "files_written (exit $rc)" bash -c "[ $rc -eq 0 ] && [ -s '$TMP/r.json' ] && [ -s '$TMP/r.csv' ] && [ -s '$TMP/r.svg' ] && [ -s '$TMP/r.html' ]"
analyze_error report_onto_directory "it is a directory; pass a file name" "$K/sampled_2rank" --svg "$TMP/empty" -q
check "quiet_prints_nothing" bash -c "[ ! -s '$TMP/files.out' ]"
check "json_parses" python3 -c "
import json, sys
j = json.load(open('$TMP/r.json'))
assert [r['rank'] for r in j['ranks']] == [0, 1], j['ranks']
t = j['ranks'][0]['total']
assert t['computing_ns'] + t['exposed_ns'] + t['free_ns'] == t['window_ns'], t
"
check "csv_header_msprof" bash -c "head -1 '$TMP/r.csv' | grep -qx 'Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,Communication(Not Overlapped and Exclude Receive),Preparing'"
check "svg_is_xml" python3 -c "import xml.dom.minidom; xml.dom.minidom.parse('$TMP/r.svg')"
check "no_temp_files_left" bash -c "! ls '$TMP' | grep -q '\.tmp\.'"
timeout 120 "$COC" analyze --json "$K/sampled_2rank" >"$TMP/stdout.json" 2>/dev/null
check "json_to_stdout" python3 -c "import json; json.load(open('$TMP/stdout.json'))"

# ---- one HTA anchor: nccl_2rank_rank0, rank 0 (hta_anchor_values.json) -----------------------------------------
timeout 120 "$COC" analyze "$K/nccl_2rank_rank0" --convention hta --json >"$TMP/hta.json" 2>"$TMP/hta.err"
check "hta_anchor_nccl_rank0" python3 -c "
import json
a = json.load(open('$TRACES/hta_anchor_values.json'))['traces']['nccl_2rank_rank0']
want_overlap = a['comm_comp_overlap'][0]['comp_comm_overlap_pctg']
want_kernel = a['temporal_breakdown'][0]['kernel_time(us)']
r = json.load(open('$TMP/hta.json'))['ranks'][0]
got_overlap = r['total']['overlap_pct']
got_kernel = r['hta']['kernel_time_ns'] / 1000
print(f'    overlap % {got_overlap:.2f} (HTA {want_overlap}), kernel time {got_kernel:.0f} us (HTA {want_kernel:.0f})')
assert abs(got_overlap - want_overlap) <= 0.05 and abs(got_kernel - want_kernel) <= 0.001 * want_kernel
"

# Output must not be left half-written when the input is bad: the report file must not appear.
timeout 60 "$COC" analyze "$TMP/cut.json.gz" --json "$TMP/never.json" >/dev/null 2>&1
check "no_partial_output_on_error" bash -c "[ ! -e '$TMP/never.json' ]"

finish
