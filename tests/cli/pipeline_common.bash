# Helpers of the pipeline tests (pipeline.sh, pipeline_interleaved.sh, pipeline_compose.sh), sourced after
# common.bash and after the caller sets C, the flags every run shares.
# losses RANKS FLAGS...: "iteration loss" of rank 0, every digit (-v); the whole log in $TMP/last.
losses() { local n="$1"; shift
  timeout 300 "$LAUNCH" -n "$n" -- "$COC" train "${C[@]}" "$@" 2>&1 | tee "$TMP/last" |
    sed -n 's/^\[rank 0\] iteration \([0-9]*\): .*loss \([0-9.]*\)$/\1 \2/p'; }
# same NAME RANKS_PP1 RANKS_PP FLAGS... -- PP_FLAGS...: the pp run's losses equal the pp 1 run's, bit for bit.
same() {
  local name="$1" n1="$2" n2="$3"; shift 3
  local base=() pp=()
  while [ "$1" != -- ]; do base+=("$1"); shift; done; shift; pp=("$@")
  losses "$n1" --deterministic "${base[@]}" > "$TMP/a"
  losses "$n2" --deterministic "${base[@]}" "${pp[@]}" > "$TMP/b"
  if [ -s "$TMP/a" ] && cmp -s "$TMP/a" "$TMP/b"; then
    echo "ok   $name: $(wc -l < "$TMP/a") losses bitwise equal"; passes=$((passes + 1))
  else
    echo "FAIL $name:"; paste "$TMP/a" "$TMP/b" | head; tail -5 "$TMP/last" | sed 's/^/    /'; fails=$((fails + 1))
  fi
}
# sample: the "--- sample ---" block of a coc train log on stdin.
sample() { sed -n '/^--- sample ---$/,/^--------------$/p'; }
# near NAME A B [RTOL]: the loss files A and B (from `losses`) hold the same iterations, within RTOL relative
# (default 1e-6).
near() {
  check "$1" bash -c "[ -s '$2' ] && paste '$2' '$3' |
    awk '{ d = \$2 - \$4; if (d < 0) d = -d; if (d / \$2 > ${4:-1e-6} || \$1 != \$3) bad = 1 } END { exit bad }'"
}
