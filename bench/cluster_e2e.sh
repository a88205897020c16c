#!/usr/bin/env bash
# End to end on the shaped cluster: `coc train` with overlap (--coc-parallel-num auto) against the plain Megatron
# order (N = 1), on the same nodes, data, seed and flags, one after the other in one cluster session.
#
# Reports the median elapsed time per iteration of each run (the first --skip iterations are left out: they hold
# the automatic choice's timing calls and the first-touch of buffers), the speedup, and whether the losses are
# identical. Both runs use --deterministic, whose results do not depend on N or schedule (coc_ops.h), so
# "identical" means equal to the last bit (the -v log prints each loss with 17 digits).
#
#   bench/cluster_e2e.sh [--mpi openmpi|mpich] [--rate 1gbit] [--config configs/cluster-e2e.yaml]
#                        [--iters 12] [--skip 3] [--json FILE] [--coc PATH] [-- extra coc train flags]
#
# Needs root (scripts/cluster). Exit status: 0 when both runs finished and the losses are identical, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit config="$here/configs/cluster-e2e.yaml" iters=12 skip=3 json="" coc=""
extra=()
die() { echo "cluster_e2e: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi) mpi=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --config) config=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --skip) skip=${2:?}; shift 2 ;;
    --json) json=${2:?}; shift 2 ;;
    --coc) coc=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# The binary must be linked with the MPI that launches it: build-mpich/ (cmake --preset mpich) for MPICH.
[ -n "$coc" ] || { [ "$mpi" = mpich ] && coc="$here/build-mpich/bin/coc" || coc="$here/build/bin/coc"; }
[ -x "$coc" ] || die "$coc not found; build it first (scripts/setup)"
[ -f "$config" ] || die "config '$config' not found"
[[ "$iters" =~ ^[0-9]+$ && "$skip" =~ ^[0-9]+$ && "$iters" -gt "$skip" ]] ||
  die "--iters ($iters) must be an integer greater than --skip ($skip)"

name="e2$(printf %x $$)"  # scripts/cluster takes 8 characters at most: pids reach 0x400000
out=$(mktemp -d /tmp/coc-e2e.XXXXXX)
cleanup() { "$here/scripts/cluster" down --name "$name" >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
"$here/scripts/cluster" up --name "$name" --rate "$rate" >/dev/null

run() {  # run LABEL N
  echo "cluster_e2e: $1 (--coc-parallel-num $2, $mpi, $rate)..." >&2
  "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" train --config "$config" --train-iters "$iters" \
    --coc-parallel-num "$2" --deterministic --sample-length 0 -v "${extra[@]}" > "$out/$1.log" 2>&1 ||
    { tail -n 20 "$out/$1.log" >&2; die "the $1 run failed (log above)"; }
}
run serial 1
run auto auto

# Per-iteration elapsed ms (rank 0's log lines) and the exact losses.
times() { sed -n 's/.*iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' "$out/$1.log" |
  awk -v s="$skip" '$1 > s {print $2}' | sort -n; }
median() { awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
losses() { grep -o 'rank 0\].*iteration [0-9]*: .*loss [0-9.e+-]*' "$out/$1.log" | sed 's/.*iteration \([0-9]*\):.*loss \(.*\)/\1 \2/'; }
t1=$(times serial | median)
ta=$(times auto | median)
identical=no
if [ -n "$(losses serial)" ] && [ "$(losses serial)" = "$(losses auto)" ]; then identical=yes; fi
choices=$(grep -h 'coc auto' "$out/auto.log" | sed 's/^\[rank 0\] //' | sort -u || true)
speedup=$(awk -v a="$t1" -v b="$ta" 'BEGIN {printf "%.3f", a / b}')
gain=$(awk -v a="$t1" -v b="$ta" 'BEGIN {printf "%.1f", (a / b - 1) * 100}')
echo "coc train on a 2-node cluster ($rate, $mpi), $(basename "$config"), $iters iterations (first $skip left out):"
printf '  N=1 (serial):  %8.1f ms per iteration (median)\n' "$t1"
printf '  auto:          %8.1f ms per iteration (median)  -> %sx, %s%% faster\n' "$ta" "$speedup" "$gain"
echo "  losses identical (17 digits, every iteration): $identical"
[ -n "$choices" ] && { echo "  automatic choices:"; echo "$choices" | sed 's/^/    /'; }
if [ -n "$json" ]; then
  python3 - "$json" "$t1" "$ta" "$identical" "$mpi" "$rate" "$config" "$iters" "$skip" "$out/serial.log" \
    "$out/auto.log" <<'EOF'
import json, re, sys
path, t1, ta, ident, mpi, rate, config, iters, skip, log1, loga = sys.argv[1:]
def series(p):
    return [float(m.group(1)) for m in re.finditer(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(p).read())]
rec = {"command": "bench/cluster_e2e.sh", "mpi": mpi, "rate": rate, "config": config, "iters": int(iters),
       "skipped": int(skip), "ms_per_iter_serial": float(t1), "ms_per_iter_auto": float(ta),
       "speedup": float(t1) / float(ta), "losses_identical": ident == "yes",
       "series_serial_ms": series(log1), "series_auto_ms": series(loga),
       "auto_choices": sorted(set(l.split("] ", 1)[-1].strip() for l in open(loga) if "coc auto" in l))}
open(path, "w").write(json.dumps(rec, indent=1) + "\n")
EOF
fi
[ "$identical" = yes ]
