#!/usr/bin/env bash
# `coc bench overlap` on the shaped 2-node cluster, launched several times, with the per-row medians over launches
# (docs/performance.md: E_norm is reported as the median over >= 3 launches; one launch already gives >= 7 reps per
# row).
#
#   bench/cluster_overlap.sh [--mpi openmpi|mpich] [--rate 1gbit] [--gso-size BYTES] [--launches 3] [--json FILE]
#                            [--coc PATH]
#                            [-- coc bench overlap flags]
#
# Defaults run the reference shape (bench/inputs/reference.yaml) with the thread engine, N in {1, 4, 8, 16, auto}
# and both schedules. Every launch's JSON is kept next to --json as FILE.launchK.json. --gso-size is scripts/cluster's
# (larger TCP segments on the links). Besides E_norm, each row prints E_cap, the E_norm its schedule would reach if
# it lost nothing but its chunking cost and the GEMM's slowdown inside the op, and the pipeline loss in ms (coc bench
# overlap: E_norm_cap, pipeline_loss_ms). Each column is its own median over the launches, so one row may mix
# launches. Needs root (scripts/cluster).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mpi=openmpi rate=1gbit gso="" launches=3 json="" coc=""
flags=(--inputs "$here/bench/inputs/reference.yaml" --engine thread --coc-parallel-num 1,4,8,16,auto
       --comm-poll-us 1000 --reps 7 --warmup 2)
script=cluster_overlap
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi|--rate|--gso-size|--launches|--json|--coc) val "$1" "${2:-}" ;;&
    --mpi) mpi=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --gso-size) gso=$2; shift 2 ;;
    --launches) launches=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; flags+=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Every argument is checked before the cluster comes up (root, seconds) and the launches start (minutes).
[[ "$launches" =~ ^[1-9][0-9]{0,8}$ ]] || die "--launches must be a positive integer below 10^9 (got '$launches')"
bench_check_common
gbit=$(awk -v r="$rate" 'BEGIN { if (r ~ /gbit$/) print r + 0; else if (r ~ /mbit$/) print (r + 0) / 1000; else print 0 }')

out=$(mktemp -d /tmp/coc-cluster-overlap.XXXXXX)
name="ov$(printf %x $$)"  # scripts/cluster takes 8 characters at most: pids reach 0x400000
bench_cluster_up ${gso:+--gso-size "$gso"}
for ((i = 1; i <= launches; i++)); do
  echo "cluster_overlap: launch $i/$launches ($mpi, $rate)..." >&2
  "$here/scripts/cluster" run --name "$name" --mpi "$mpi" -- "$coc" bench overlap "${flags[@]}" \
    --link-rate "$gbit" --json "$out/launch$i.json" > "$out/launch$i.txt" 2>&1 ||
    { tail -n 20 "$out/launch$i.txt" >&2; die "launch $i failed (output above)"; }
  [ -n "$json" ] && cp "$out/launch$i.json" "${json%.json}.launch$i.json"
done
python3 - "$out" "$launches" "$mpi" "$rate" "${json:-}" "${gso:-65536}" <<'EOF'
import json, statistics, sys
out, launches, mpi, rate, dest, gso = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
runs = [json.load(open(f"{out}/launch{i}.json")) for i in range(1, launches + 1)]
keyf = lambda r: (r["problem"], r["op"], r["engine"], str(r["N"]), r["algo"] if r["N"] != "auto" else "auto",
                  r["fused"])
rows = {}
for run in runs:
    for r in run["rows"]:
        rows.setdefault(keyf(r), []).append(r)
print(f"coc bench overlap on the 2-node cluster ({rate}, {mpi}, GSO {gso} B): medians over {launches} launches "
      f"(each a median of {runs[0]['reps']} reps)")
print(f"{'problem':10} {'op':14} {'N':>4} {'algo':10} | {'T_serial':>8} {'T_overl':>8} {'T_ideal':>8} | "
      f"{'S':>5} {'E_norm':>6} {'E per launch':>20} {'E_cap':>5} {'pipe':>5} | auto chose")
summary = []
for k, rs in rows.items():
    med = lambda f: statistics.median(f(r) for r in rs)
    e = [r["E_norm"] for r in rs]
    chose = ", ".join(sorted({f"N={r['auto_choice']['parallel_num']} {r['auto_choice']['algo']}"
                              for r in rs if r.get("auto_choice")}))
    row = {"problem": k[0], "op": k[1], "engine": k[2], "N": k[3], "algo": k[4], "fused": k[5],
           "t_serial_ms": med(lambda r: r["t_serial_ms"]["median"]),
           "t_overlap_ms": med(lambda r: r["t_overlap_ms"]["median"]), "t_ideal_ms": med(lambda r: r["t_ideal_ms"]),
           "S": med(lambda r: r["S"]), "E_norm": statistics.median(e), "E_norm_per_launch": e,
           "E_norm_cap": med(lambda r: r["E_norm_cap"]), "pipeline_loss_ms": med(lambda r: r["pipeline_loss_ms"]),
           "auto_chose": chose}
    summary.append(row)
    print(f"{k[0]:10} {k[1]:14} {k[3]:>4} {k[4]:10} | {row['t_serial_ms']:8.1f} {row['t_overlap_ms']:8.1f} "
          f"{row['t_ideal_ms']:8.1f} | {row['S']:5.2f} {row['E_norm']:6.2f} "
          f"{' '.join(f'{x:.2f}' for x in e):>20} {row['E_norm_cap']:5.2f} {row['pipeline_loss_ms']:5.1f} | {chose}")
if dest:
    json.dump({"command": "bench/cluster_overlap.sh", "mpi": mpi, "rate": rate, "gso_size": gso, "launches": launches,
               "environment": runs[0]["environment"], "rows": summary}, open(dest, "w"), indent=1)
EOF
