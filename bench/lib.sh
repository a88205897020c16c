# The argument checks every cluster benchmark script shares (sourced, not run). The script sets `script` (its name
# for messages) and `here` (the repository root) first, and calls bench_check_common after parsing: each argument is
# checked before the cluster comes up (root, seconds) and the runs start (minutes).
die() { echo "$script: $*" >&2; exit 2; }
val() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }  # val FLAG "$2"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

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
