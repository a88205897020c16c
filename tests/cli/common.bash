# Helpers for the CLI tests (not a test itself: CTest runs only *.sh). Sourced by tests/cli/*.sh, which CTest runs as `bash SCRIPT COC_BINARY PROJECT_ROOT`.
set -uo pipefail
COC="$1"
ROOT="$2"
LAUNCH="$ROOT/scripts/launch"
TMP=$(mktemp -d /tmp/coc-cli-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
passes=0

# expect_error NAME EXPECTED_REGEX RANKS -- ARGS...: the command must exit non-zero within 60 s, and its stderr must
# contain exactly one "coc: error:" line matching the regex (one clear line, not one per rank). RANKS 0 runs coc
# without the launcher, for commands that do no MPI (convert): mpirun's start-up alone takes seconds.
expect_error() {
  local name="$1" pattern="$2" ranks="$3"
  shift 4
  local out="$TMP/$name.err"
  local start=$SECONDS
  if [ "$ranks" -eq 0 ]; then
    timeout 60 "$COC" "$@" >"$TMP/$name.out" 2>"$out"
  else
    timeout 60 "$LAUNCH" -n "$ranks" -- "$COC" "$@" >"$TMP/$name.out" 2>"$out"
  fi
  local rc=$?
  last_rc=$rc  # for a following exit-code check
  local lines
  lines=$(grep -c "coc: error:" "$out")
  if [ $rc -eq 0 ]; then
    echo "FAIL $name: exit 0 (expected an error)"; fails=$((fails + 1)); return
  fi
  if [ $rc -eq 124 ]; then
    echo "FAIL $name: hung (killed after 60 s)"; fails=$((fails + 1)); return
  fi
  if ! grep "coc: error:" "$out" | grep -Eq -e "$pattern"; then
    echo "FAIL $name: exit $rc but no error line matching /$pattern/:"; sed 's/^/    /' "$out"; fails=$((fails + 1)); return
  fi
  if [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines error lines (expected one):"; sed 's/^/    /' "$out"; fails=$((fails + 1)); return
  fi
  echo "ok   $name: exit $rc after $((SECONDS - start)) s: $(grep "coc: error:" "$out" | head -1 | cut -c1-160)"
  passes=$((passes + 1))
}

# mpmd -n 1 PROG ARGS : -n 1 PROG ARGS...: a launch with different arguments per rank (which scripts/launch cannot
# express), through the launcher of the MPI under test (COC_MPI, set by CTest: openmpi or mpich). Hydra takes no
# run-as-root or oversubscribe flags (it allows both) and rejects Open MPI's.
mpmd() {
  if [ "${COC_MPI:-openmpi}" = mpich ]; then
    mpiexec.mpich "$@"
  else
    mpirun --allow-run-as-root --oversubscribe --quiet "$@"
  fi
}

# passes_check NAME RANKS -- ARGS...: exit 0 and "PASSED" on stdout (`coc check`) within PASSES_TIMEOUT seconds
# (default 120); on failure the first lines of its output.
passes_check() {
  local name="$1" ranks="$2"; shift 3
  if timeout "${PASSES_TIMEOUT:-120}" "$LAUNCH" -n "$ranks" -- "$COC" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &&
    grep -q PASSED "$TMP/$name.out"; then
    echo "ok   $name"; passes=$((passes + 1))
  else
    echo "FAIL $name:"; sed 's/^/    /' "$TMP/$name.out" "$TMP/$name.err" | head -30; fails=$((fails + 1))
  fi
}

check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then echo "ok   $name"; passes=$((passes + 1)); else echo "FAIL $name"; fails=$((fails + 1)); fi
}

finish() {
  echo "$passes passed, $fails failed"
  [ "$fails" -eq 0 ]
}
