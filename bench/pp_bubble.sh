#!/usr/bin/env bash
# The pipeline bubble and the stage transfers' hidden share on the shaped cluster (issue 34's "Bubble"): one node
# per pipeline stage, tp 1, in one cluster session, a profiled `coc train` run (step 3 of 4, after warm-up) per setting:
#   1F1B; 1F1B with --overlap-p2p-communication; interleaved 1F1B with 2 virtual stages (+ the overlap);
# and for each, `coc analyze --json`: per rank the bubble (waits for the neighbour's activation or gradient) next to
# the ideal (P − 1)/(V·M + P − 1), and the pp communicator row: the time its transfers were in flight and the share
# of it hidden behind compute, 1 − (pp exposed − bubble) / pp communication (the bubble is the wait for a
# neighbour that had nothing to send yet: exposed by design, not a transfer left unhidden; docs/analysis.md).
#
#   bench/pp_bubble.sh [--nodes 2] [--rate 1gbit] [--micro-batches 8] [--layers 8] [--hidden 256] [--seq 512]
#                      [--coc PATH] [--out DIR] [--json FILE] [-- extra coc train flags]
#
# --nodes is P (2 or 4; the machine's cores are shared: with 4 nodes on 2 cores, two ranks share a core and a
# waiting rank's polls take time from the rank it waits for, so the bubble reads high). M = --micro-batches (the
# global batch is M micro-batches of 1 sequence). Needs root (scripts/cluster). Logs stay in DIR (a fresh folder
# under /tmp by default). About 5 minutes at the defaults: run by hand, not in CI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
script=pp_bubble.sh
mpi=openmpi rate=1gbit nodes=2 mb=8 layers=8 hidden=256 seq=512 json="" coc="" out=""
extra=()
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes|--rate|--micro-batches|--layers|--hidden|--seq|--coc|--out|--json) val "$1" "${2:-}" ;;&
    --nodes) nodes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --micro-batches) mb=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
bench_uints nodes mb layers hidden seq
[ "$nodes" -ge 2 ] || die "--nodes must be >= 2: one pipeline stage per node (got $nodes)"
[ $((mb % nodes)) -eq 0 ] ||
  die "--micro-batches ($mb) must be a multiple of --nodes ($nodes): the interleaved schedule needs M % P == 0"
[ $((layers % (2 * nodes))) -eq 0 ] ||
  die "--layers ($layers) must be a multiple of 2 × --nodes ($((2 * nodes))): 2 virtual stages per node"
bench_check_common
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-pp-bubble.XXXXXX)
mkdir -p "$out"
name="pb$(printf %x $$)"
bench_cluster_up --nodes "$nodes"
trap bench_cleanup_keep EXIT  # the logs stay: take the cluster down only

heads=$((hidden / 64 > 0 ? hidden / 64 : 1))
base=(train --tp 1 --pp "$nodes" --num-layers "$layers" --hidden-size "$hidden" --num-attention-heads "$heads"
      --ffn-hidden-size "$((hidden * 11 / 4))" --seq-length "$seq" --micro-batch-size 1 --global-batch-size "$mb"
      --train-iters 4 --no-progress --sample-length 0 --profile --profile-step-start 3)
settings=("1f1b|" "1f1b-overlap|--overlap-p2p-communication" "v2|--num-virtual-stages-per-pipeline-rank 2"
          "v2-overlap|--num-virtual-stages-per-pipeline-rank 2 --overlap-p2p-communication")
for s in "${settings[@]}"; do
  label=${s%%|*}
  read -r -a flags <<< "${s#*|}"
  echo "== $label: coc train --pp $nodes ${flags[*]} (M $mb, profiled step 3 of 4)" >&2
  "$here/scripts/cluster" run --name "$name" -n "$nodes" -- "$coc" "${base[@]}" "${flags[@]}" \
    --profile-dir "$out/$label" "${extra[@]}" > "$out/$label.log" 2>&1 ||
    { tail -n 20 "$out/$label.log" >&2; die "the $label run failed ($out/$label.log)"; }
  "$coc" analyze --json "$out/$label.json" "$out/$label" > "$out/$label.txt" 2>&1 ||
    { cat "$out/$label.txt" >&2; die "coc analyze failed on $label"; }
done

python3 - "$out" "$json" "${settings[@]}" <<'EOF'
import json, sys
out, dest, settings = sys.argv[1], sys.argv[2], [s.split("|")[0] for s in sys.argv[3:]]
rows = []
print(f"{'setting':14} {'rank':>4} {'bubble %':>9} {'ideal %':>8} {'÷ ideal':>8} {'pp comm ms':>11} "
      f"{'exposed ms':>11} {'hidden %':>9}")
for label in settings:
    r = json.load(open(f"{out}/{label}.json"))
    for k in r["ranks"]:
        p = k["pipeline"]
        pp = next(g for g in k["comm_groups"] if g["name"] == "pp")
        comm, exposed = pp["communication_ns"], max(0, pp["exposed_ns"] - p["bubble_ns"])
        hidden = 100.0 * (1 - exposed / comm) if comm else 0.0
        rows.append({"setting": label, "rank": k["rank"], "bubble_pct": p["bubble_pct"],
                     "ideal_bubble_pct": p["ideal_bubble_pct"], "pp_communication_ms": comm / 1e6,
                     "pp_exposed_besides_bubble_ms": exposed / 1e6, "pp_hidden_pct": hidden})
        print(f"{label:14} {k['rank']:>4} {p['bubble_pct']:9.1f} {p['ideal_bubble_pct']:8.1f} "
              f"{p['bubble_pct'] / p['ideal_bubble_pct']:8.2f} {comm / 1e6:11.1f} {exposed / 1e6:11.1f} {hidden:9.1f}")
if dest:
    json.dump(rows, open(dest, "w"), indent=1)
EOF
echo "logs, traces and analyses: $out" >&2
