# The argument checks and the cluster set-up every cluster benchmark script shares (sourced, not run). The script sets `script` (its name
# for messages) and `here` (the repository root) first, and calls bench_check_common after parsing: each argument is
# checked before the cluster comes up (root, seconds) and the runs start (minutes).
die() { echo "$script: $*" >&2; exit 2; }
val() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }  # val FLAG "$2"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# bench_uints VAR...: each flag's value (--var-name in the message) must be a decimal integer below 10^9; it is
# rewritten without leading zeros, since $(( 08 )) is an octal error, not eight.
bench_uints() {
  local v
  for v in "$@"; do
    [[ "${!v}" =~ ^[0-9]{1,9}$ ]] || die "--${v//_/-} must be a non-negative integer below 10^9 (got '${!v}')"
    printf -v "$v" %d "$((10#${!v}))"
  done
}

# --mpi, the --json destination, and the binary: $coc, or the build linked with that MPI (build-mpich/ for MPICH).
bench_check_common() {
  case "$mpi" in openmpi|mpich) ;; *) die "--mpi must be openmpi or mpich (got '$mpi')" ;; esac
  if [ -n "$json" ]; then
    [ ! -d "$json" ] || die "--json '$json' is a directory; pass a file name"
    local jdir
    jdir=$(dirname "$json")
    [ -d "$jdir" ] && [ -w "$jdir" ] || die "--json '$json': folder '$jdir' does not exist or is not writable"
  fi
  [ -n "$coc" ] || { [ "$mpi" = mpich ] && coc="$here/build-mpich/bin/coc" || coc="$here/build/bin/coc"; }
  [ -f "$coc" ] && [ -x "$coc" ] ||
    die "$coc is not an executable file; build it first (scripts/setup, or cmake --preset mpich for --mpi mpich)"
}

# Brings up this run's cluster (--name $name --rate $rate, plus any further `scripts/cluster up` flags) and, on exit
# or interruption, takes it down and removes $out. Only a cluster this run brought up is taken down: a failed `up`
# (the name taken by another run) must leave that one alone.
bench_cluster_up() {
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  "$here/scripts/cluster" up --name "$name" --rate "$rate" "$@" >/dev/null
  cluster_started=1
}
bench_cleanup() {
  [ -z "${cluster_started:-}" ] || "$here/scripts/cluster" down --name "$name" >/dev/null 2>&1 || true
  rm -rf "$out"
}
# The same for a run whose logs stay in $out: after bench_cluster_up, `trap bench_cleanup_keep EXIT`.
bench_cleanup_keep() {
  [ -z "${cluster_started:-}" ] || "$here/scripts/cluster" down --name "$name" >/dev/null 2>&1 || true
}

# bench_median_ms LOG: the median elapsed ms per iteration of a coc or peer log (their lines share the words
# "elapsed time per iteration (ms): X") after its first $skip iterations; fails when none is left.
bench_median_ms() {
  grep -o "elapsed time per iteration (ms): [0-9.]*" "$1" | awk -v s="$skip" 'NR > s { print $NF }' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print v[int((NR + 1) / 2)] }'
}
