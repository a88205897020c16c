#!/usr/bin/env bash
# Does mc2 pay? The MoE dispatchers on the shaped 2-node cluster: one rank per node, ep 2, so every all-to-all of
# the MoE layers crosses the link (docs/semantics.md §6).
#
#  1. `coc bench train --ep-dispatcher mc2 --baseline "--ep-dispatcher eager"`: one run whose iterations alternate
#     between eager (even) and mc2 (odd), seconds apart on the same machine state, with --deterministic, so both
#     sides train the same numbers (the loss curve is either side's alone).
#  2. `coc train --profile` once with each dispatcher: the share of the MoE all-to-all time (the spans tagged
#     "moe dispatch" / "moe combine" on the comm track) that a compute task overlaps, per rank, and the trace's
#     overall Overlap Analysis line. The last 4 of --profile-iters iterations are profiled (at least from the third):
#     the routing, and with it every token buffer's size, still moves over the first iterations, and the process's
#     heap grows with it until it holds the largest (coc/runtime/memory.h); until then a step page-faults fresh
#     buffers in, which the profile would show as idle time.
#
# The default shape makes the all-to-all take about as long as the expert GEMMs on a 1 Gbit/s link: 2 × 2048
# tokens per rank and iteration (seq 256 × micro-batch 8), hidden 512, 4 experts of width 512, top-2: each
# all-to-all moves ~2 MB across the link (~16 ms) against ~20-40 ms of expert GEMMs. One decoder layer keeps the
# dense gradient all-reduce (~5 MB, the same on both sides) small.
#
#   bench/moe_dispatch.sh [--name NAME] [--mpi openmpi|mpich] [--rate 1gbit] [--iters 16] [--skip-pairs 2]
#                         [--profile-iters 10] [--json FILE] [--coc PATH] [-- extra coc train flags]
#
# Extra flags come last and win (e.g. -- --moe-mc2-chunks 4 --hidden-size 1024). Needs root (scripts/cluster).
# Exit status: 0 when every run finished, 2 for bad arguments or a failed run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit iters=16 skip_pairs=2 profile_iters=10 json="" coc="" name="moe$(printf %x $$)"
extra=()
script=moe_dispatch
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --name|--mpi|--rate|--iters|--skip-pairs|--profile-iters|--json|--coc) val "$1" "${2:-}" ;;&
    --name) name=$2; shift 2 ;;
    --mpi) mpi=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --skip-pairs) skip_pairs=$2; shift 2 ;;
    --profile-iters) profile_iters=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Every argument is checked before the cluster comes up (root, seconds) and the runs start (minutes).
bench_uints iters skip_pairs profile_iters
[ "$iters" -ge $((2 * (skip_pairs + 1))) ] ||
  die "--iters ($iters) leaves no timed pair after --skip-pairs $skip_pairs; use --iters $((2 * (skip_pairs + 1))) or more"
[ "$profile_iters" -ge 3 ] || die "--profile-iters must be >= 3 (the first 2 iterations are not profiled)"
profile_start=$(( profile_iters > 6 ? profile_iters - 4 : 2 ))
[ ${#name} -le 8 ] || die "--name '$name' is longer than 8 characters (scripts/cluster's limit)"
bench_check_common
gbit=$(awk -v r="$rate" 'BEGIN { if (r ~ /gbit$/) print r + 0; else if (r ~ /mbit$/) print (r + 0) / 1000; else print 0 }')

shape=(--config "$here/configs/moe.yaml" --num-layers 1 --hidden-size 512 --num-attention-heads 8
       --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 512 --seq-length 256 --micro-batch-size 8
       --global-batch-size 16 --expert-model-parallel-size 2 --moe-mc2-chunks 2 --comm-engine inline
       --deterministic --sample-length 0 --no-progress)
out=$(mktemp -d /tmp/coc-moe-dispatch.XXXXXX)
bench_cluster_up
crun() { "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" "$@"; }

echo "moe_dispatch: coc bench train, mc2 against --baseline \"--ep-dispatcher eager\" ($iters iterations)..." >&2
crun bench train "${shape[@]}" --ep-dispatcher mc2 --baseline "--ep-dispatcher eager" --train-iters "$iters" \
  --skip-pairs "$skip_pairs" --link-rate "$gbit" --json "$out/bench.json" "${extra[@]}" >"$out/bench.txt" 2>&1 ||
  { tail -n 20 "$out/bench.txt" >&2; die "coc bench train failed (output above)"; }
for d in eager mc2; do
  echo "moe_dispatch: coc train --profile --ep-dispatcher $d ($profile_iters iterations)..." >&2
  crun train "${shape[@]}" --ep-dispatcher "$d" --train-iters "$profile_iters" --profile \
    --profile-step-start "$profile_start" --profile-dir "$out/prof-$d" "${extra[@]}" >"$out/train-$d.txt" 2>&1 ||
    { tail -n 20 "$out/train-$d.txt" >&2; die "coc train --profile --ep-dispatcher $d failed (output above)"; }
done
grep -v "^\[rank" "$out/bench.txt" | grep -A4 "^coc bench train" || true
python3 - "$out" "${json:-}" "$rate" "$mpi" <<'EOF'
import glob, json, sys
out, dest, rate, mpi = sys.argv[1:5]

def union(iv):
    iv = sorted(iv)
    merged = []
    for b, e in iv:
        if merged and b <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([b, e])
    return merged

def length(iv):
    return sum(e - b for b, e in iv)

def intersect(a, b):
    i = j = 0
    res = []
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            res.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return res

result = {"rate": rate, "mpi": mpi, "bench": json.load(open(f"{out}/bench.json")), "profile": {}}
print(f"MoE all-to-all hidden behind compute (profiled iterations, per rank; spans tagged 'moe dispatch'/'moe combine'):")
for d in ("eager", "mc2"):
    trace = glob.glob(f"{out}/prof-{d}/*.json")[0]
    ev = json.load(open(trace))["traceEvents"]
    per_rank = {}
    for e in ev:
        if e.get("ph") != "X" or e.get("pid", 0) >= 1000000:
            continue
        r = per_rank.setdefault(e["pid"], {"moe": [], "compute": []})
        span = [e["ts"], e["ts"] + e["dur"]]
        tag = e.get("args", {}).get("tag", "")
        if e.get("cat") == "comm" and (tag.startswith("moe dispatch") or tag.startswith("moe combine")):
            r["moe"].append(span)
        elif e.get("cat") == "compute":
            r["compute"].append(span)
    rows = {}
    for pid, r in sorted(per_rank.items()):
        m, c = union(r["moe"]), union(r["compute"])
        total, hidden = length(m), length(intersect(m, c))
        rows[pid] = {"moe_all_to_all_ms": total / 1000, "hidden_ms": hidden / 1000,
                     "hidden_share": hidden / total if total else 0}
        print(f"  {d:5} rank {pid}: all-to-all {total / 1000:8.1f} ms, hidden {hidden / 1000:8.1f} ms "
              f"({100 * rows[pid]['hidden_share']:.0f}%)")
    result["profile"][d] = rows
    for line in open(f"{out}/train-{d}.txt"):
        if "profile:" in line and "steps" in line:
            print(f"  {d:5} {line.strip()}")
b = result["bench"]
print(f"coc bench train: eager {b['ms_per_iter_baseline']:.1f} ms, mc2 {b['ms_per_iter_run']:.1f} ms per iteration "
      f"-> {b['speedup']:.3f}x (median of the pairs' ratios {b['speedup_median_of_pairs']:.3f}x), {rate}, {mpi}")
if dest:
    json.dump(result, open(dest, "w"), indent=1)
EOF
