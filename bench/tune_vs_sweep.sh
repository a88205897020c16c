#!/usr/bin/env bash
# Issue 36's second acceptance test: `coc tune` against the exhaustive sweep over the same switches, on the shaped
# 2-node cluster, in one cluster session:
#   1. bench/tune_sweep.sh: every combination of the families, each against the run as given (the table, best first);
#   2. coc tune over the same families (--families), from the run as given;
#   3. the tuned configuration against the sweep's best combination, one alternating run (`coc tune --config
#      tuned.yaml --candidate BEST`): ms(tuned) / ms(best) is the verdict (the issue asks within 5%), and the two
#      wall times say whether tune took at most a third of the sweep's.
#
#   bench/tune_vs_sweep.sh [--rate 1gbit] [--families a,b,...] [--budget 10] [--iters 20] [--allow-math-change]
#                          [--coc PATH] [--out DIR] [--sweep SWEEP.md] -- TRAINING FLAGS (or --config FILE)
#
# --sweep SWEEP.md: step 1 is taken from an earlier run's table (its best row and the time on its last line) instead
# of sweeping again; the table must be of the same flags and families (a long sweep is then paid once).
# --allow-math-change: passed to the sweep and to tune (the layout, the micro-batch size, --bf16, ... need it).
# --families: tune's family names (docs/tune.md); default: every family that applies (the sweep may then be long:
# bench/tune_sweep.sh --dry-run counts it first). Needs root (scripts/cluster). The sweep's table, tune's log, JSON and
# YAML and the head-to-head stay in DIR (a fresh folder under /tmp by default). Run by hand, not in CI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
script=tune_vs_sweep.sh
mpi=openmpi rate=1gbit families="" budget=10 iters=20 json="" coc="" out="" math=() sweep=""
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --rate|--families|--budget|--iters|--coc|--out|--sweep) val "$1" "${2:-}" ;;&
    --rate) rate=$2; shift 2 ;;
    --families) families=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sweep) sweep=$2; shift 2 ;;
    --allow-math-change) math=(--allow-math-change); shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ $# -gt 0 ] || die "give the run to tune after '--' (coc train flags, or --config FILE)"
bench_uints budget iters
if [ -n "$sweep" ]; then
  [ -f "$sweep" ] || die "--sweep $sweep: no such file"
  grep -q '^[0-9]* combination(s) in [0-9]* s;' "$sweep" ||
    die "--sweep $sweep: no 'N combination(s) in S s' line (a table written by bench/tune_sweep.sh)"
fi
[ "$budget" -ge 1 ] || die "--budget must be >= 1 minute: tune needs time to try a switch"
[ "$iters" -ge 6 ] || die "--iters ($iters) leaves no timed pair after tune's 2 warm-up pairs; use --iters 6 or more"
bench_check_common
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-tune-vs-sweep.XXXXXX)
mkdir -p "$out"
name="tv$(printf %x $$)"
bench_cluster_up
trap bench_cleanup_keep EXIT  # the logs stay: take the cluster down only
launch="$here/scripts/cluster run --name $name --"
fam=()
[ -z "$families" ] || fam=(--families "$families")

if [ -n "$sweep" ]; then
  echo "== 1. the sweep: $sweep" >&2
  [ "$(realpath "$sweep")" = "$(realpath -m "$out/sweep.md")" ] || cp "$sweep" "$out/sweep.md"
  sweep_s=$(sed -n 's/^[0-9]* combination(s) in \([0-9]*\) s;.*/\1/p' "$out/sweep.md")
else
  echo "== 1. the sweep ($rate)" >&2
  t0=$SECONDS
  "$here/bench/tune_sweep.sh" --launch "$launch" --coc "$coc" --iters "$iters" "${fam[@]}" "${math[@]}" \
    --out "$out/sweep.md" -- "$@" 2> >(tee "$out/sweep.log" >&2) || die "the sweep failed ($out/sweep.log)"
  sweep_s=$((SECONDS - t0))
fi
best=$(awk -F' \\| ' 'NR == 3 { sub(/^\| /, "", $1); print $1 }' "$out/sweep.md")
[ -n "$best" ] || die "no combination in the sweep's table ($out/sweep.md)"

echo "== 2. coc tune over the same families (budget $budget min)" >&2
t0=$SECONDS
$launch "$coc" tune "$@" "${fam[@]}" "${math[@]}" --budget "$budget" --tune-iters "$iters" --out "$out/tuned.yaml" \
  --json "$out/tune.json" </dev/null >"$out/tune.log" 2>&1 || { tail -n 30 "$out/tune.log" >&2; die "coc tune failed"; }
tune_s=$((SECONDS - t0))
sed -n '/^coc tune: [0-9]* s of/,$p' "$out/tune.log" | sed 's/^\[rank 0\] //'

echo "== 3. the tuned configuration against the sweep's best ($best), one alternating run" >&2
$launch "$coc" tune --config "$out/tuned.yaml" --candidate "$best" "${math[@]}" --tune-iters "$iters" --out "$out/h2h.yaml" \
  --json "$out/h2h.json" </dev/null >"$out/h2h.log" 2>&1 || { tail -n 30 "$out/h2h.log" >&2; die "the head-to-head failed"; }
python3 - "$out/h2h.json" "$sweep_s" "$tune_s" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][0]
sweep_s, tune_s = int(sys.argv[2]), int(sys.argv[3])
r = s["ms_before"] / s["ms_after"]  # ms(tuned) / ms(best)
print(f"tuned {s['ms_before']:.1f} ms, the sweep's best {s['ms_after']:.1f} ms per iteration: tuned / best = {r:.3f} "
      f"(pairs tuned/best {s['pair_ratio_median']:.3f}; "
      f"{'within 5%' if r <= 1.05 else 'more than 5% slower'}); tune {tune_s} s against the sweep's {sweep_s} s "
      f"({tune_s / max(sweep_s, 1):.2f} of it{', at most a third' if 3 * tune_s <= sweep_s else ''})")
PY
echo "the sweep's table, tune's log, JSON and YAML: $out" >&2
