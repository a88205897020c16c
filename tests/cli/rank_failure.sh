#!/usr/bin/env bash
# coc-test-timeout: 60
# Edge case 18 of docs/edge-cases.md: one rank throws while the others wait in a collective. The whole job must exit
# non-zero within 30 s (MPI_Abort through the error policy, coc/comm/error_policy.h), and stderr must name the failing
# rank. Uses the hidden `coc env --fail-on-rank R`. Also: a uniform error is printed once and exits with code 2.
source "$(dirname "$0")/common.bash"

# fails_fast NAME RANKS VICTIM
fails_fast() {
  local name="$1" ranks="$2" victim="$3"
  local start_ns end_ns ms rc
  start_ns=$(date +%s%N)
  timeout 45 "$LAUNCH" -n "$ranks" -- "$COC" env --fail-on-rank "$victim" >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
  end_ns=$(date +%s%N)
  ms=$(( (end_ns - start_ns) / 1000000 ))
  if [ $rc -eq 0 ]; then echo "FAIL $name: exit 0"; fails=$((fails + 1)); return; fi
  if [ $rc -eq 124 ]; then echo "FAIL $name: job hung (killed after 45 s)"; fails=$((fails + 1)); return; fi
  if [ $ms -ge 30000 ]; then echo "FAIL $name: took $ms ms (limit 30 s)"; fails=$((fails + 1)); return; fi
  if ! grep -q "coc: error: \[rank $victim\] injected failure" "$TMP/$name.err"; then
    echo "FAIL $name: stderr does not name rank $victim:"; sed 's/^/    /' "$TMP/$name.err"; fails=$((fails + 1))
    return
  fi
  echo "ok   $name: exit $rc after $ms ms: $(grep 'coc: error:' "$TMP/$name.err" | head -1)"
  passes=$((passes + 1))
}

fails_fast rank1_of_2 2 1
fails_fast rank0_of_2 2 0
fails_fast rank2_of_3_oversubscribed 3 2

# A uniform error (every rank sees it) is one line from rank 0 and a clean exit with the kind's code (2).
expect_error uniform_error_once "fail-on-rank 9 but the job has only 2 rank" 2 -- env --fail-on-rank 9
check "uniform error does not name a rank" bash -c "! grep -q '\[rank' '$TMP/uniform_error_once.err'"
check "uniform error exit code is 2" bash -c "'$LAUNCH' -n 2 -- '$COC' env --fail-on-rank 9 2>/dev/null; test \$? -eq 2"
finish
