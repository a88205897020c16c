#!/usr/bin/env bash
# coc-test-timeout: 300
# `coc analyze` (issue 3): the table, --json that parses, msprof-style --csv, --svg and --html files, one HTA anchor
# reproduced under --convention hta, no MPI needed, and bad input (truncated .json.gz, a non-trace file, a missing
# path, a folder with no traces) answered by one error line and a non-zero exit. The trace checks run on coc's
# synthetic Kineto fixtures always, and again on the shared real traces when they are present.
source "$(dirname "$0")/common.bash"
TRACES="${COC_SHARED_DIR:-$ROOT/../shared}/traces"

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

# ---- the checks on one set of Kineto traces ------------------------------------------------------------------------
# check_traces LABEL KINETO_DIR EXPECTED_JSON: KINETO_DIR holds <name>/ folders named after the public traces;
# EXPECTED_JSON their figures under HTA's conventions (the schema of shared/traces/hta_anchor_values.json).
check_traces() {
  local label="$1" K="$2" anchors="$3"
  local T="$TMP/$label"
  mkdir -p "$T"
  echo "-- $label traces: $K"
  # A gzip stream cut in the middle: the error must name the file and a byte offset, and no table may appear.
  local nccl="$K/nccl_2rank_rank0/nccl_data.json.gz"
  head -c $(( $(stat -c %s "$nccl") / 2 )) "$nccl" > "$T/cut.json.gz"
  analyze_error "${label}_truncated_gzip" "cut.json.gz.*byte [0-9]+" "$T/cut.json.gz"

  # The table, without mpirun and without MPI_Init.
  local start=$SECONDS rc
  env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM timeout 120 "$COC" analyze "$K/sampled_2rank" \
    >"$T/table.out" 2>"$T/table.err"
  rc=$?
  check "$label: table_sampled_2rank (exit $rc, $((SECONDS - start)) s)" \
    bash -c "[ $rc -eq 0 ] && grep -q '^rank 0' '$T/table.out' && grep -q '^rank 1' '$T/table.out' && grep -q 'overlap%' '$T/table.out'"
  check "$label: table_has_rank_balance" grep -q "rank balance" "$T/table.out"
  check "$label: no_mpi_banner" bash -c "! grep -qi 'mpi' '$T/table.err'"
  sed -n 1,12p "$T/table.out"

  # A CPU-only Kineto trace: no device activity as HTA sees it; coc's own CPU analysis otherwise (analyze_torch_cpu.sh).
  timeout 120 "$COC" analyze --convention hta "$K/cpu_only" >"$T/cpu.out" 2>&1
  check "$label: cpu_only_no_device_activity under --convention hta (exit $?)" grep -q "no device activity" "$T/cpu.out"
  timeout 120 "$COC" analyze "$K/cpu_only" >"$T/cpu.out" 2>&1
  check "$label: cpu_only analysed as torch-cpu (exit $?)" grep -q "(torch-cpu)" "$T/cpu.out"

  # All traces of the set at once: every file gives a rank section or a clear refusal, never a crash.
  timeout 200 "$COC" analyze "$K"/*/ --rank-map "$(echo "$K"/distributed_info_unavailable/*.json.gz)=900" \
    >"$T/all.out" 2>"$T/all.err"
  rc=$?
  check "$label: all_traces (exit $rc)" bash -c "[ $rc -eq 0 ] || { [ $rc -eq 2 ] && grep -q 'duplicate rank' '$T/all.err'; }"
  [ $rc -ne 0 ] && sed 's/^/    /' "$T/all.err" | head -3

  # --json, --csv, --svg, --html.
  timeout 120 "$COC" analyze "$K/sampled_2rank" --json "$T/r.json" --csv "$T/r.csv" --svg "$T/r.svg" \
    --html "$T/r.html" -q >"$T/files.out" 2>&1
  rc=$?
  check "$label: files_written (exit $rc)" bash -c "[ $rc -eq 0 ] && [ -s '$T/r.json' ] && [ -s '$T/r.csv' ] && [ -s '$T/r.svg' ] && [ -s '$T/r.html' ]"
  analyze_error "${label}_report_onto_directory" "it is a directory; pass a file name" "$K/sampled_2rank" --svg "$TMP/empty" -q
  check "$label: quiet_prints_nothing" bash -c "[ ! -s '$T/files.out' ]"
  check "$label: json_parses" python3 -c "
import json, sys
j = json.load(open('$T/r.json'))
assert [r['rank'] for r in j['ranks']] == [0, 1], j['ranks']
t = j['ranks'][0]['total']
assert t['computing_ns'] + t['exposed_ns'] + t['free_ns'] == t['window_ns'], t
"
  check "$label: csv_header_msprof" bash -c "head -1 '$T/r.csv' | grep -qx 'Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,Communication(Not Overlapped and Exclude Receive),Preparing'"
  check "$label: svg_is_xml" python3 -c "import xml.dom.minidom; xml.dom.minidom.parse('$T/r.svg')"
  check "$label: no_temp_files_left" bash -c "! ls '$T' | grep -q '\.tmp\.'"
  timeout 120 "$COC" analyze --json "$K/sampled_2rank" >"$T/stdout.json" 2>/dev/null
  check "$label: json_to_stdout" python3 -c "import json; json.load(open('$T/stdout.json'))"

  # One anchor: nccl_2rank_rank0, rank 0 (HTA's own figures on the shared trace, the hand-derived ones on ours).
  timeout 120 "$COC" analyze "$K/nccl_2rank_rank0" --convention hta --json >"$T/hta.json" 2>"$T/hta.err"
  check "$label: hta_anchor_nccl_rank0" python3 -c "
import json
a = json.load(open('$anchors'))['traces']['nccl_2rank_rank0']
want_overlap = a['comm_comp_overlap'][0]['comp_comm_overlap_pctg']
want_kernel = a['temporal_breakdown'][0]['kernel_time(us)']
r = json.load(open('$T/hta.json'))['ranks'][0]
got_overlap = r['total']['overlap_pct']
got_kernel = r['hta']['kernel_time_ns'] / 1000
print(f'    overlap % {got_overlap:.2f} (expected {want_overlap}), kernel time {got_kernel:.0f} us (expected {want_kernel:.0f})')
assert abs(got_overlap - want_overlap) <= 0.05 and abs(got_kernel - want_kernel) <= 0.001 * want_kernel
"

  # Output must not be left half-written when the input is bad: the report file must not appear.
  timeout 60 "$COC" analyze "$T/cut.json.gz" --json "$T/never.json" >/dev/null 2>&1
  check "$label: no_partial_output_on_error" bash -c "[ ! -e '$T/never.json' ]"
}

# coc's synthetic fixtures, in every checkout (tests/analysis/data/README.md); the real traces when the shared checkout
# is beside the repository (or at COC_SHARED_DIR, which CTest sets from the CMake variable of that name).
check_traces synthetic "$ROOT/tests/analysis/data/kineto" "$ROOT/tests/analysis/data/kineto_expected.json"
if [ -d "$TRACES/kineto" ]; then
  check_traces shared "$TRACES/kineto" "$TRACES/hta_anchor_values.json"
else
  echo "skip: $TRACES/kineto not found (the shared real traces); the checks ran on the synthetic fixtures only"
fi
finish
