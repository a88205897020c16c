#!/usr/bin/env bash
# --bf16 against fp32 and against PyTorch's CPU autocast (issue 35; docs/mixed-precision.md), on one node, with the
# environment as it comes and with OPENBLAS_CORETYPE unset:
#   1. `coc bench train --bf16 --baseline "--no-bf16"` at issue 35's shape (tp 2, hidden 256, 4 layers, 8 heads,
#      FFN 640, sequence 256, micro-batch 8) and on the llama2-7b-layer preset: the two precisions alternate
#      iteration by iteration on the same weights, so the ratio is measured within one run;
#   2. whole runs alternating `coc train --bf16` and `peer_torch_tp.py --bf16` (torch.autocast on the CPU, gloo) at
#      issue 35's shape, --rounds times: the median ms per iteration of each, and their ratio.
#
#   bench/bf16_speed.sh [--coc PATH] [--peer PATH] [--python PATH] [--rounds 2] [--iters 20] [--skip 3]
#                       [--no-7b] [--out DIR]
#
# --peer defaults to ../shared/peers/peer_torch_tp.py beside the repository (skipped with a note when absent);
# --python to /usr/bin/python3 (Debian's python3-torch). --no-7b skips the llama2-7b-layer run (about 5 minutes).
# Writes the logs under DIR (a fresh folder under /tmp by default). Minutes: run by hand, not in CI.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
script=bf16_speed.sh
source "$here/bench/lib.sh"
coc="$here/build/bin/coc"; peer="$here/../shared/peers/peer_torch_tp.py"; py=/usr/bin/python3
rounds=2; iters=20; skip=3; out=""; big=1
while [ $# -gt 0 ]; do
  case "$1" in
    --coc) val "$@"; coc="$2"; shift 2 ;;
    --peer) val "$@"; peer="$2"; shift 2 ;;
    --python) val "$@"; py="$2"; shift 2 ;;
    --rounds) val "$@"; rounds="$2"; shift 2 ;;
    --iters) val "$@"; iters="$2"; shift 2 ;;
    --skip) val "$@"; skip="$2"; shift 2 ;;
    --no-7b) big=0; shift ;;
    --out) val "$@"; out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_uints rounds iters skip
[ "$rounds" -ge 1 ] || die "--rounds must be >= 1"
[ "$iters" -gt "$skip" ] || die "--iters ($iters) must be above --skip ($skip)"
[ -x "$coc" ] || die "$coc is not an executable file; build it first (scripts/setup)"
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-bf16-speed.XXXXXX)
mkdir -p "$out"
shape=(--tp 2 --hidden-size 256 --num-layers 4 --num-attention-heads 8 --ffn-hidden-size 640 --seq-length 256
       --micro-batch-size 8 --global-batch-size 8 --no-progress --sample-length 0)
have_peer=1
[ -f "$peer" ] && "$py" -c "import torch" 2>/dev/null ||
  { have_peer=0; echo "note: no PyTorch peer ($peer with $py and torch): the peer runs are skipped"; }


for envname in env unset; do
  runenv=(env)
  [ "$envname" = unset ] && runenv=(env -u OPENBLAS_CORETYPE)
  echo "== environment: $envname (OPENBLAS_CORETYPE=$([ "$envname" = unset ] && echo unset || echo "${OPENBLAS_CORETYPE:-unset}"))"
  "${runenv[@]}" "$here/scripts/launch" -n 2 -- "$coc" bench train "${shape[@]}" --train-iters "$((2 * iters))" \
    --bf16 --baseline "--no-bf16" >"$out/alternate-$envname.log" 2>&1 || die "bench train failed ($out/alternate-$envname.log)"
  echo "issue 35's shape, bf16 against fp32 in one run:"; grep -A2 "^coc bench train:" "$out/alternate-$envname.log" | tail -2
  if [ "$big" = 1 ]; then
    "${runenv[@]}" "$here/scripts/launch" -n 2 -- "$coc" bench train --model-preset llama2-7b-layer --train-iters 10 \
      --no-progress --bf16 --baseline "--no-bf16" >"$out/7b-$envname.log" 2>&1 || die "7b run failed ($out/7b-$envname.log)"
    echo "llama2-7b-layer, bf16 against fp32 in one run:"; grep -A2 "^coc bench train:" "$out/7b-$envname.log" | tail -2
  fi
  [ "$have_peer" = 1 ] || continue
  cs=(); ps=()
  for r in $(seq 1 "$rounds"); do
    "${runenv[@]}" "$here/scripts/launch" -n 2 -- "$coc" train "${shape[@]}" --train-iters "$iters" --bf16 \
      >"$out/coc-$envname-$r.log" 2>&1 || die "coc train failed ($out/coc-$envname-$r.log)"
    "${runenv[@]}" OMP_NUM_THREADS=1 "$py" "$peer" --tp 2 --hidden 256 --layers 4 --heads 8 --ffn 640 --seq 256 \
      --batch 8 --iters "$iters" --bf16 >"$out/peer-$envname-$r.log" 2>&1 || die "peer failed ($out/peer-$envname-$r.log)"
    c=$(bench_median_ms "$out/coc-$envname-$r.log"); p=$(bench_median_ms "$out/peer-$envname-$r.log")
    printf "round %d: coc --bf16 %8s ms/iteration   peer --bf16 %8s ms/iteration   peer/coc %.2fx\n" "$r" "$c" "$p" \
      "$(awk -v p="$p" -v c="$c" 'BEGIN { print p / c }')"
    cs+=("$c"); ps+=("$p")
  done
  # The rounds' medians: one slow round (this VM's noise is +-10%) moves a median less than a mean.
  c=$(printf '%s\n' "${cs[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1]) / 2 }')
  p=$(printf '%s\n' "${ps[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1]) / 2 }')
  printf "median of %d rounds: coc --bf16 %s ms/iteration   peer --bf16 %s ms/iteration   peer/coc %.2fx\n" "$rounds" \
    "$c" "$p" "$(awk -v p="$p" -v c="$c" 'BEGIN { print p / c }')"
done
echo "logs: $out"
