#!/usr/bin/env bash
# End to end on the shaped cluster: `coc train` with overlap (--coc-parallel-num auto) against the plain Megatron
# order (N = 1), on the same nodes, data, seed and flags, in one cluster session.
#
# The speed-up comes from `coc bench train`: one training run whose iterations alternate between N = 1 and auto,
# so that both sides are timed seconds apart on the same machine state (docs/performance.md: compare overlap on and off
# in the same run). Whole runs of each side follow, --repeat times, alternating (serial, auto, serial, ...): their
# medians are reported too, but a shared VM's slow spells of minutes move them (the same binary gave 1.03x to
# 1.46x in four such pairs). Every run uses --deterministic, whose results do not depend on N or schedule
# (coc_ops.h), so the losses of the N = 1 runs, the auto runs and the alternating run must be equal to the last
# bit (the -v log prints each loss with 17 digits). The first --skip iterations of each whole run and the first
# --skip-pairs pairs of the alternating run are left out: they hold the automatic choice's timing calls and the
# first use of the CoC ops' scratch buffers (the activations are allocated at start-up).
#
#   bench/cluster_e2e.sh [--mpi openmpi|mpich] [--rate 1gbit] [--config configs/cluster-e2e.yaml]
#                        [--iters 40] [--skip 3] [--skip-pairs 2] [--repeat 1] [--json FILE] [--coc PATH]
#                        [-- extra coc train flags]
#
# Needs root (scripts/cluster). Exit status: 0 when every run finished and the losses are identical, 1 when they
# differ, 2 for bad arguments or a failed run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit config="$here/configs/cluster-e2e.yaml" iters=40 skip=3 skip_pairs=2 repeat=1 json="" coc=""
extra=()
script=cluster_e2e
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi|--rate|--config|--iters|--skip|--skip-pairs|--repeat|--json|--coc) val "$1" "${2:-}" ;;&
    --mpi) mpi=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --skip-pairs) skip_pairs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Every argument is checked before the cluster comes up (root, seconds) and the runs start (minutes).
bench_uints iters skip skip_pairs repeat
[ "$iters" -gt "$skip" ] || die "--iters ($iters) must be greater than --skip ($skip): no iteration would be timed"
[ "$repeat" -ge 1 ] || die "--repeat ($repeat) must be >= 1"
[ "$iters" -ge $((2 * (skip_pairs + 1))) ] ||
  die "--iters ($iters) leaves no timed pair of the alternating run after --skip-pairs $skip_pairs; use --iters $((2 * (skip_pairs + 1))) or more"
[ -f "$config" ] || die "config '$config' not found (a YAML file such as configs/cluster-e2e.yaml)"
bench_check_common

name="e2$(printf %x $$)"  # scripts/cluster takes 8 characters at most: pids reach 0x400000
out=$(mktemp -d /tmp/coc-e2e.XXXXXX)
bench_cluster_up

run() {  # run LABEL N [FLAGS...]: one run, logged to $out/LABEL.<i>.log
  local log="$out/$1.$i.log" label=$1 n=$2
  shift 2
  echo "cluster_e2e: $label (--coc-parallel-num $n $*, $mpi, $rate), run $i of $repeat..." >&2
  "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" train --config "$config" --train-iters "$iters" \
    --coc-parallel-num "$n" "$@" --deterministic --sample-length 0 -v "${extra[@]}" > "$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "the $label run failed (log above)"; }
}
echo "cluster_e2e: alternating N=1 and auto in one run (coc bench train, $mpi, $rate)..." >&2
gbit=$(awk -v r="$rate" 'BEGIN { if (r ~ /gbit$/) print r + 0; else if (r ~ /mbit$/) print (r + 0) / 1000; else print 0 }')
"$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" bench train --config "$config" \
  --train-iters "$iters" --coc-parallel-num auto --deterministic --skip-pairs "$skip_pairs" --link-rate "$gbit" \
  --json "$out/ab.json" -v "${extra[@]}" > "$out/ab.log" 2>&1 ||
  { tail -n 20 "$out/ab.log" >&2; die "the alternating run failed (log above)"; }
for ((i = 1; i <= repeat; i++)); do
  # The plain order overlaps nothing: also not the backward's dX reduction with the dW GEMM (on by default).
  run serial 1 --disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute
  run auto auto
done

# Per-iteration elapsed ms (rank 0's log lines) over every run of a side, and the exact losses of one run.
times() { local f; for f in "$out/$1".*.log; do
    sed -n 's/.*iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' "$f" |
      awk -v s="$skip" '$1 > s {print $2}'
  done | sort -n; }
median() { awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
losses() { grep -o 'rank 0\].*iteration [0-9]*: .*loss [0-9.e+-]*' "$1" | sed 's/.*iteration \([0-9]*\):.*loss \(.*\)/\1 \2/'; }
t1=$(times serial | median)
ta=$(times auto | median)
identical=yes
ref=$(losses "$out/serial.1.log")
[ -n "$ref" ] || identical=no
for f in "$out"/serial.*.log "$out"/auto.*.log "$out"/ab.log; do [ "$(losses "$f")" = "$ref" ] || identical=no; done
ab_line() { python3 -c "import json,sys; d=json.load(open('$out/ab.json')); print(d[sys.argv[1]])" "$1"; }
ab1=$(ab_line ms_per_iter_baseline) aba=$(ab_line ms_per_iter_run) abs=$(ab_line speedup)
abp=$(ab_line speedup_median_of_pairs)
choices=$(cat "$out"/auto.*.log | grep 'coc auto' | sed 's/^\[rank 0\] //' | sort -u || true)
speedup=$(awk -v a="$t1" -v b="$ta" 'BEGIN {printf "%.3f", a / b}')
gain=$(awk -v a="$t1" -v b="$ta" 'BEGIN {printf "%.1f", (a / b - 1) * 100}')
echo "coc train on a 2-node cluster ($rate, $mpi), $(basename "$config"), $iters iterations per run:"
echo "  one run, iterations alternating N=1 and auto (coc bench train; first $skip_pairs pairs left out):"
printf '    N=1 (serial):  %8.1f ms per iteration (median)\n' "$ab1"
printf '    auto:          %8.1f ms per iteration (median)  -> %.3fx (median of the pairs: %.3fx)\n' "$aba" "$abs" "$abp"
echo "  whole runs, $repeat of each side, alternating (first $skip iterations left out):"
printf '    N=1 (serial):  %8.1f ms per iteration (median)\n' "$t1"
printf '    auto:          %8.1f ms per iteration (median)  -> %sx, %s%% faster\n' "$ta" "$speedup" "$gain"
echo "  losses identical (17 digits, every iteration of the N=1, auto and alternating runs): $identical"
[ -n "$choices" ] && { echo "  automatic choices:"; echo "$choices" | sed 's/^/    /'; }
if [ -n "$json" ]; then
  python3 - "$json" "$t1" "$ta" "$identical" "$mpi" "$rate" "$config" "$iters" "$skip" "$repeat" "$out" <<'EOF'
import json, re, sys
path, t1, ta, ident, mpi, rate, config, iters, skip, repeat, out = sys.argv[1:]
def series(p):
    return [float(m.group(1)) for m in re.finditer(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(p).read())]
runs = range(1, int(repeat) + 1)
rec = {"command": "bench/cluster_e2e.sh", "mpi": mpi, "rate": rate, "config": config, "iters": int(iters),
       "skipped": int(skip), "repeat": int(repeat), "losses_identical": ident == "yes",
       "whole_runs": {"ms_per_iter_serial": float(t1), "ms_per_iter_auto": float(ta),
                      "speedup": float(t1) / float(ta)},
       "alternating": json.load(open(f"{out}/ab.json")),
       "series_serial_ms": [series(f"{out}/serial.{i}.log") for i in runs],
       "series_auto_ms": [series(f"{out}/auto.{i}.log") for i in runs],
       "auto_choices": sorted(set(l.split("] ", 1)[-1].strip() for i in runs for l in open(f"{out}/auto.{i}.log")
                                  if "coc auto" in l))}
open(path, "w").write(json.dumps(rec, indent=1) + "\n")
EOF
fi
[ "$identical" = yes ]
