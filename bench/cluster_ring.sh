#!/usr/bin/env bash
# `coc bench ring-attention` (context parallelism) on the shaped 2-node cluster, launched several times: the share of
# the ring's KV transfer time hidden under block attention, with one communicator and with send and receive on two
# (--use-cp-send-recv-overlap), as medians over the launches (docs/performance.md, "Ring attention").
#
#   bench/cluster_ring.sh [--mpi openmpi|mpich] [--rate 1gbit] [--launches 3] [--json FILE] [--coc PATH]
#                         [-- coc bench ring-attention flags]
#
# The default shape (S = 2048, 8 heads of 64, cp = 2, causal) is one where a KV block's transfer over 1 Gbit/s takes
# about as long as its block attention on one core. Every launch's JSON is kept next to --json as FILE.launchK.json.
# Needs root (scripts/cluster).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit launches=3 json="" coc=""
flags=(--seq-length 2048 --num-attention-heads 8 --kv-channels 64 --reps 5 --warmup 1)
script=cluster_ring
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi|--rate|--launches|--json|--coc) val "$1" "${2:-}" ;;&
    --mpi) mpi=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --launches) launches=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; flags+=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$launches" =~ ^[1-9][0-9]{0,8}$ ]] || die "--launches must be a positive integer below 10^9 (got '$launches')"
bench_check_common

out=$(mktemp -d /tmp/coc-cluster-ring.XXXXXX)
name="rg$(printf %x $$)"  # scripts/cluster takes 8 characters at most
bench_cluster_up
for ((i = 1; i <= launches; i++)); do
  echo "cluster_ring: launch $i/$launches ($mpi, $rate)..." >&2
  "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" bench ring-attention "${flags[@]}" \
    --json "$out/launch$i.json" >"$out/launch$i.txt" 2>&1 ||
    { tail -n 20 "$out/launch$i.txt" >&2; die "launch $i failed (output above)"; }
  [ -n "$json" ] && cp "$out/launch$i.json" "${json%.json}.launch$i.json"
done
python3 - "$out" "$launches" "$mpi" "$rate" "${json:-}" <<'EOF'
import json, statistics, sys
out, launches, mpi, rate, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = [json.load(open(f"{out}/launch{i}.json")) for i in range(1, launches + 1)]
r0 = runs[0]
print(f"coc bench ring-attention on the 2-node cluster ({rate}, {mpi}): cp={r0['cp']}, seq {r0['seq']}, "
      f"heads {r0['heads']} x {r0['head_dim']}, {r0['mask']} mask, {r0['engine']} engine; medians over {launches} "
      f"launches")
summary = {}
for k, name in enumerate(r["variant"] for r in r0["rows"]):
    ms = statistics.median(run["rows"][k]["time_ms"]["median"] for run in runs)
    line = f"  {name:32} {ms:9.1f} ms"
    entry = {"time_ms": ms}
    if "hidden" in r0["rows"][k]:
        h = [run["rows"][k]["hidden"] for run in runs]
        entry["hidden"], entry["hidden_per_launch"] = statistics.median(h), h
        line += f"   hidden {100 * statistics.median(h):5.1f}%  (per launch: {', '.join(f'{100 * x:.0f}%' for x in h)})"
    summary[name] = entry
    print(line)
transfers = summary["transfers alone"]["time_ms"]
compute = summary["serial (wait each transfer)"]["time_ms"] - transfers
print(f"  transfers {transfers:.0f} ms against about {compute:.0f} ms of attention (serial minus transfers); hidden = "
      f"(T_serial - T_overlapped) / T_transfers")
print(f"  attention memory per rank: {statistics.median(run['attention_memory_mib'] for run in runs):.1f} MiB")
if dest:
    json.dump({"command": "bench/cluster_ring.sh", "mpi": mpi, "rate": rate, "launches": launches,
               "summary": summary, "runs": [f"{dest.rsplit('.json', 1)[0]}.launch{i}.json"
                                            for i in range(1, launches + 1)]}, open(dest, "w"), indent=1)
EOF
