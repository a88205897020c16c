#!/usr/bin/env bash
# --bf16 on the shaped 2-node cluster (issue 35: "overlap still pays", and against PyTorch's CPU autocast), at
# configs/cluster-e2e.yaml's shape, in one cluster session:
#   1. `coc bench train --bf16`: one run whose iterations alternate N = 1 and the config's CoC setting (auto), both in
#      bf16 on the same weights; the ratio of the pairs is the overlap's gain in bf16;
#   2. --profiles profiled `coc train --bf16` runs (3 steps after warm-up each) and `coc analyze`: exposed
#      communication and free time per rank, against the health criteria (exposed <= 10%, free < 3%), with the part
#      of the exposed time spent waiting for a later rank and the spread of the ranks' compute times: on a VM whose
#      cores run at unequal speeds from one run to the next, the faster rank waits for the slower one in every
#      collective (docs/analysis.md, "Waiting for a later rank"), so one run is not enough to judge the overlap;
#   3. whole runs alternating `coc train --bf16` and `peer_torch_tp.py --bf16` (torch.autocast on the CPU, gloo, one
#      process per node, pinned like coc's ranks), --rounds times: the median ms per iteration of each, and the ratio.
#
#   bench/bf16_cluster.sh [--rate 1gbit] [--config configs/cluster-e2e.yaml] [--iters 20] [--skip 3] [--rounds 2]
#                         [--profiles 1] [--coc PATH] [--peer PATH] [--python PATH] [--out DIR]
#                         [-- extra coc train flags]
#
# --peer defaults to ../shared/peers/peer_torch_tp.py beside the repository (step 3 is skipped with a note when it or
# torch is absent). The peer gets the config's model shape (hidden, layers, heads, FFN, sequence, micro-batch), tp 2
# without sequence parallelism (Megatron's plain order). Needs root (scripts/cluster). Logs stay in DIR (a fresh
# folder under /tmp by default). About 10 minutes: run by hand, not in CI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
script=bf16_cluster.sh
mpi=openmpi rate=1gbit config="$here/configs/cluster-e2e.yaml" iters=20 skip=3 rounds=2 profiles=1 json="" coc="" out=""
peer="$here/../shared/peers/peer_torch_tp.py" py=/usr/bin/python3
extra=()
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --rate|--config|--iters|--skip|--rounds|--profiles|--coc|--peer|--python|--out) val "$1" "${2:-}" ;;&
    --rate) rate=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --profiles) profiles=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
bench_uints iters skip rounds profiles
[ "$iters" -gt "$skip" ] || die "--iters ($iters) must be greater than --skip ($skip): no iteration would be timed"
[ "$rounds" -ge 1 ] || die "--rounds must be >= 1"
[ "$profiles" -ge 1 ] || die "--profiles must be >= 1"
[ -f "$config" ] || die "config '$config' not found (a YAML file such as configs/cluster-e2e.yaml)"
bench_check_common
have_peer=1
[ -f "$peer" ] && "$py" -c "import torch" 2>/dev/null ||
  { have_peer=0; echo "note: no PyTorch peer ($peer with $py and torch): the peer runs are skipped" >&2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-bf16-cluster.XXXXXX)
mkdir -p "$out"
name="bf$(printf %x $$)"
bench_cluster_up
trap bench_cleanup_keep EXIT  # the logs stay: take the cluster down only
cfg_val() { sed -n "s/^$1: *//p" "$config" | head -1; }

echo "== 1. N=1 against $(cfg_val coc-parallel-num) in bf16, alternating in one run ($rate)" >&2
"$here/scripts/cluster" run --name "$name" -- "$coc" bench train --config "$config" --bf16 \
  --train-iters "$((2 * iters))" --skip-pairs 2 --json "$out/ab.json" "${extra[@]}" > "$out/ab.log" 2>&1 ||
  { tail -n 20 "$out/ab.log" >&2; die "the alternating run failed ($out/ab.log)"; }
grep -A3 "^coc bench train:" "$out/ab.log" | sed 's/^\[rank 0\] //' || tail -n 5 "$out/ab.log"

echo "== 2. $profiles profile(s) of coc train --bf16 (steps 4-6) and the Overlap Analysis" >&2
for ((i = 1; i <= profiles; i++)); do
  p="$out/profile.$i"
  "$here/scripts/cluster" run --name "$name" -- "$coc" train --config "$config" --bf16 --train-iters 6 --profile \
    --profile-step-start 4 --profile-dir "$p" "${extra[@]}" > "$p.log" 2>&1 ||
    { tail -n 20 "$p.log" >&2; die "the profiled run failed ($p.log)"; }
  "$coc" analyze "$p" > "$p.txt" 2>&1 || { cat "$p.txt" >&2; die "coc analyze failed"; }
  # Per rank: its header, the table's header and total row (exposed and free, with their verdicts), the part of the
  # exposed time spent waiting for a later rank, and the per-communicator exposure; then the compute balance.
  [ "$profiles" -gt 1 ] && echo "-- profile $i of $profiles ($p.txt)"
  grep -E "^rank |^  step |^  total |^  exposed while |^    [a-z-]+ +[0-9.]+ µs in|^compute balance" "$p.txt"
done

if [ "$have_peer" = 1 ]; then
  echo "== 3. whole runs alternating coc train --bf16 and the PyTorch peer --bf16 ($rounds rounds)" >&2
  subnet=$(cat "/run/coc-cluster/$name/subnet")
  shape=(--tp 2 --hidden "$(cfg_val hidden-size)" --layers "$(cfg_val num-layers)" --heads "$(cfg_val num-attention-heads)"
         --ffn "$(cfg_val ffn-hidden-size)" --seq "$(cfg_val seq-length)" --batch "$(cfg_val micro-batch-size)")
  run_peer() {  # one gloo process per node, pinned to core X like coc's rank X
    local pids=() r
    for r in 0 1; do
      ip netns exec "$name-n$r" env RANK=$r MASTER_ADDR="10.$subnet.0.1" MASTER_PORT=29533 GLOO_SOCKET_IFNAME=eth0 \
        taskset -c "$r" "$py" "$peer" "${shape[@]}" --iters "$iters" --bf16 > "$out/peer.$1.rank$r.log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || die "the peer run failed ($out/peer.$1.rank*.log)"; done
  }
  for ((i = 1; i <= rounds; i++)); do
    "$here/scripts/cluster" run --name "$name" -- "$coc" train --config "$config" --bf16 --train-iters "$iters" \
      --no-progress "${extra[@]}" > "$out/coc.$i.log" 2>&1 || die "the coc run failed ($out/coc.$i.log)"
    run_peer "$i"
    c=$(bench_median_ms "$out/coc.$i.log") p=$(bench_median_ms "$out/peer.$i.rank0.log")
    printf 'round %d: coc --bf16 %.1f ms, peer --bf16 %.1f ms per iteration: coc %.2fx faster\n' "$i" "$c" "$p" \
      "$(awk -v a="$p" -v b="$c" 'BEGIN { print a / b }')"
  done
fi
echo "logs: $out" >&2
