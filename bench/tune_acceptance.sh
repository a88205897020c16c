#!/usr/bin/env bash
# Issue 36's first acceptance run: `coc tune` on the shaped 2-node cluster, starting from configs/cluster-e2e.yaml
# with every overlap switch off, against the hand-tuned default (the config as it is, where those switches are on),
# in one cluster session:
#   1. coc tune --config CONFIG <every overlap switch off> --budget B --out tuned.yaml --json tune.json --report
#      tune.html;
#   2. the confirmation: the tuned configuration against the default, measured the way a tune step measures
#      (`coc tune --config tuned.yaml --candidate KEY=VALUE,...`, where the keys are the switches turned off in step
#      1 with the default's values: one alternating run). Its ratio ms(tuned) / ms(default) is the verdict: the
#      issue asks tune to land within 3% of the default, or faster.
#
#   bench/tune_acceptance.sh [--rate 1gbit] [--config configs/cluster-e2e.yaml] [--budget 20] [--coc PATH]
#                            [--out DIR] [-- extra coc flags for both steps]
#
# Needs root (scripts/cluster). Logs, YAML, JSON and HTML stay in DIR (a fresh folder under /tmp by default). About
# 15 minutes at --budget 12: run by hand, not in CI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
script=tune_acceptance.sh
mpi=openmpi rate=1gbit config="$here/configs/cluster-e2e.yaml" budget=20 json="" coc="" out=""
extra=()
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --rate|--config|--budget|--coc|--out) val "$1" "${2:-}" ;;&
    --rate) rate=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
bench_uints budget
[ "$budget" -ge 1 ] || die "--budget must be >= 1 minute: tune needs time to try a switch"
[ -f "$config" ] || die "config '$config' not found (a YAML file such as configs/cluster-e2e.yaml)"
bench_check_common
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-tune-acceptance.XXXXXX)
mkdir -p "$out"
name="ta$(printf %x $$)"
bench_cluster_up
trap bench_cleanup_keep EXIT  # the logs stay: take the cluster down only

# The overlap switches of the hand-tuned default, each as tune's flag turned off and as the default's KEY=VALUE.
off=(--coc-parallel-num 1 --disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute --no-delay-column-wgrad
     --no-attention-dense-pipeline --no-attention-dense-backward-pipeline --no-swiglu-down-pipeline
     --no-attention-qkv-backward-pipeline --no-swiglu-down-backward-pipeline)
default="coc-parallel-num=auto,tp-comm-bulk-wgrad=true,delay-wgrad-compute=true,delay-column-wgrad=true"
default+=",attention-dense-pipeline=true,attention-dense-backward-pipeline=true,swiglu-down-pipeline=true"
default+=",attention-qkv-backward-pipeline=true,swiglu-down-backward-pipeline=true"

echo "== 1. coc tune from $(basename "$config") with every overlap switch off (budget $budget min, $rate)" >&2
"$here/scripts/cluster" run --name "$name" -- "$coc" tune --config "$config" "${off[@]}" --budget "$budget" \
  --out "$out/tuned.yaml" --json "$out/tune.json" --report "$out/tune.html" "${extra[@]}" > "$out/tune.log" 2>&1 ||
  { tail -n 30 "$out/tune.log" >&2; die "coc tune failed ($out/tune.log)"; }
sed -n '/^coc tune: [0-9]* s of/,$p' "$out/tune.log" | sed 's/^\[rank 0\] //'

echo "== 2. the tuned configuration against the hand-tuned default, one alternating run" >&2
"$here/scripts/cluster" run --name "$name" -- "$coc" tune --config "$out/tuned.yaml" --candidate "$default" \
  --out "$out/confirm.yaml" --json "$out/confirm.json" "${extra[@]}" > "$out/confirm.log" 2>&1 ||
  { tail -n 30 "$out/confirm.log" >&2; die "the confirmation failed ($out/confirm.log)"; }
python3 - "$out/confirm.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][0]
ratio = s["ms_before"] / s["ms_after"]  # ms(tuned) / ms(default)
print(f"tuned {s['ms_before']:.1f} ms, hand-tuned default {s['ms_after']:.1f} ms per iteration: tuned / default "
      f"= {ratio:.3f} ({'within 3% or faster' if ratio <= 1.03 else 'more than 3% slower'})")
EOF
echo "logs, YAML, JSON and the HTML report: $out" >&2
