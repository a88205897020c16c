#!/usr/bin/env bash
# "Prefetch pays" (issue 17, docs/semantics.md §4): on the shaped 2-node cluster, optim_grads_params at dp = 2 with
# FSDP prefetch against gathering on demand, in one run each (`coc bench train --baseline`: the even iterations run
# F = B = 0, the odd ones the run's F and B, seconds apart on the same machine state). F = B = 1 and F = B = 2 are
# measured. Then one profiled run per depth (0, 1, 2) gives the exposed communication of the overlap analysis
# (`coc analyze --json`): what prefetch hid is the drop of exposed communication from F = 0.
# All runs use --deterministic: prefetch changes when a gather runs, not what it computes, so every side of every
# run trains the same numbers (checked: the -v losses of the two sides of each run are equal to the last bit).
#
#   bench/fsdp_prefetch.sh [--mpi openmpi|mpich] [--rate 1gbit] [--config configs/fsdp-prefetch.yaml]
#                          [--iters 20] [--skip-pairs 2] [--name NAME] [--json FILE] [--coc PATH] [-- extra flags]
#
# Needs root (scripts/cluster). Exit status: 0 when every run finished and the losses agree, 1 when they differ,
# 2 for bad arguments or a failed run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit config="$here/configs/fsdp-prefetch.yaml" iters=20 skip_pairs=2 json="" coc=""
name="fp$(printf %x $$)"
extra=()
script=fsdp_prefetch
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi|--rate|--config|--iters|--skip-pairs|--name|--json|--coc) val "$1" "${2:-}" ;;&
    --mpi) mpi=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --skip-pairs) skip_pairs=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
bench_uints iters skip_pairs
[ "$iters" -ge $((2 * (skip_pairs + 1))) ] ||
  die "--iters ($iters) leaves no timed pair after --skip-pairs $skip_pairs; use --iters $((2 * (skip_pairs + 1))) or more"
[[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name '$name' must be 1-8 lowercase letters or digits, starting with a letter (scripts/cluster names namespaces with it)"
[ -f "$config" ] || die "config '$config' not found (a YAML file such as configs/fsdp-prefetch.yaml)"
bench_check_common

out=$(mktemp -d /tmp/coc-fsdp.XXXXXX)
bench_cluster_up
gbit=$(awk -v r="$rate" 'BEGIN { if (r ~ /gbit$/) print r + 0; else if (r ~ /mbit$/) print (r + 0) / 1000; else print 0 }')
on_cluster() { "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$@"; }

identical=yes
losses() { grep -o 'rank 0\].*iteration [0-9]*: .*loss [0-9.e+-]*' "$1" | sed 's/.*iteration \([0-9]*\):.*loss \(.*\)/\1 \2/'; }
for d in 1 2; do
  echo "fsdp_prefetch: F=B=$d against F=B=0 in one run (coc bench train, $mpi, $rate)..." >&2
  on_cluster "$coc" bench train --config "$config" --train-iters "$iters" --deterministic --skip-pairs "$skip_pairs" \
    --num-to-forward-prefetch "$d" --num-to-backward-prefetch "$d" \
    --baseline "--num-to-forward-prefetch 0 --num-to-backward-prefetch 0" --link-rate "$gbit" \
    --json "$out/ab$d.json" -v "${extra[@]}" > "$out/ab$d.log" 2>&1 ||
    { tail -n 20 "$out/ab$d.log" >&2; die "the F=B=$d run failed (log above)"; }
  [ -n "$(losses "$out/ab$d.log")" ] || identical=no
done
[ "$(losses "$out/ab1.log")" = "$(losses "$out/ab2.log")" ] || identical=no
for d in 0 1 2; do
  echo "fsdp_prefetch: profiled run, F=B=$d..." >&2
  on_cluster "$coc" train --config "$config" --train-iters 6 --deterministic --num-to-forward-prefetch "$d" \
    --num-to-backward-prefetch "$d" --profile --profile-step-start 2 --profile-dir "$out/prof$d" "${extra[@]}" \
    > "$out/prof$d.log" 2>&1 || { tail -n 20 "$out/prof$d.log" >&2; die "the profiled F=B=$d run failed"; }
  "$coc" analyze "$out/prof$d" --json "$out/an$d.json" > /dev/null 2>&1 || die "coc analyze of F=B=$d failed"
done
python3 - "$out" "$rate" "$mpi" "$config" "$iters" "$skip_pairs" "$identical" "${json:-}" <<'PY'
import json, sys
out, rate, mpi, config, iters, skip, ident, path = sys.argv[1:]
ab = {d: json.load(open(f"{out}/ab{d}.json")) for d in (1, 2)}
def totals(d):
    """Exposed and total FSDP communication (the "fsdp ..." communicators of the analysis' per-communicator split)
    and computing ms, summed over the ranks' profiled steps."""
    ranks = json.load(open(f"{out}/an{d}.json"))["ranks"]
    fsdp = [g for r in ranks for g in r["comm_groups"] if g["name"].startswith("fsdp")]
    return [sum(g[k] for g in fsdp) / 1e6 for k in ("exposed_ns", "communication_ns")] + \
           [sum(r["total"]["computing_ns"] for r in ranks) / 1e6]
tot = {d: totals(d) for d in (0, 1, 2)}
ex = {d: tot[d][0] for d in (0, 1, 2)}
# What prefetch could hide: the smaller of FSDP communication and compute at F=0. The issue's measure takes the
# smaller per layer; the sum of the per-layer minima is at most this, so the share below is a lower bound of it.
hideable = min(tot[0][1], tot[0][2])
print(f"FSDP prefetch on a 2-node cluster ({rate}, {mpi}), {config.split('/')[-1]}, {iters} iterations per run:")
for d in (1, 2):
    r = ab[d]
    print(f"  F=B={d} vs F=B=0 (coc bench train --baseline, first {skip} pairs left out): "
          f"{r['ms_per_iter_baseline']:.1f} -> {r['ms_per_iter_run']:.1f} ms per iteration, "
          f"{r['speedup']:.3f}x (median of the pairs {r['speedup_median_of_pairs']:.3f}x)")
for d in (0, 1, 2):
    drop = (f", {100 * (ex[0] - ex[d]) / ex[0]:.0f}% less than F=0; hidden {100 * (ex[0] - ex[d]) / hideable:.0f}% "
            f"of the hideable {hideable:.1f} ms" if d and ex[0] > 0 and hideable > 0 else "")
    print(f"  exposed FSDP communication (profile, coc analyze): F=B={d}: {ex[d]:.1f} ms{drop}")
print(f"  losses identical (17 digits, both sides of both runs): {ident}")
if path:
    rec = {"command": "bench/fsdp_prefetch.sh", "rate": rate, "mpi": mpi, "config": config, "iters": int(iters),
           "skip_pairs": int(skip), "losses_identical": ident == "yes", "alternating": {f"F=B={d}": ab[d] for d in ab},
           "exposed_comm_ms": {f"F=B={d}": ex[d] for d in ex}, "hideable_ms": hideable}
    open(path, "w").write(json.dumps(rec, indent=1) + "\n")
PY
[ "$identical" = yes ]
