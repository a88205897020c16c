#!/usr/bin/env bash
# The GEMM back ends (coc/kernels/gemm.h, docs/performance.md point 26), with the environment as it comes and with
# OPENBLAS_CORETYPE unset:
#   1. `coc bench gemm` (fp32 oneDNN against fp32 OpenBLAS against bf16, interleaved in one run), once per
#      environment;
#   2. `coc train` at issue 35's shape on 2 ranks (tp 2, one node), whole runs alternating COC_GEMM_BACKEND=openblas
#      and onednn (a process-wide setting, so it cannot alternate within a run), --rounds times per environment;
#      the median ms per iteration of each run (iterations after the first --skip) and whether both back ends'
#      runs ended at the same loss to 1e-3.
#
#   bench/gemm_backends.sh [--coc PATH] [--rounds 2] [--iters 20] [--skip 3] [--out DIR]
#
# Writes DIR/gemm-{env,unset}.json (coc bench gemm) and DIR/train-{env,unset}-{openblas,onednn}-R.jsonl
# (coc train --log-json); DIR defaults to a fresh folder under /tmp. Minutes: run by hand, not in CI.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
script=gemm_backends.sh
source "$here/bench/lib.sh"
coc="$here/build/bin/coc"; rounds=2; iters=20; skip=3; out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --coc) val "$@"; coc="$2"; shift 2 ;;
    --rounds) val "$@"; rounds="$2"; shift 2 ;;
    --iters) val "$@"; iters="$2"; shift 2 ;;
    --skip) val "$@"; skip="$2"; shift 2 ;;
    --out) val "$@"; out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
bench_uints rounds iters skip
[ "$rounds" -ge 1 ] || die "--rounds must be >= 1"
[ "$iters" -gt "$skip" ] || die "--iters ($iters) must be above --skip ($skip)"
[ -x "$coc" ] || die "$coc is not an executable file; build it first (scripts/setup)"
[ -n "$out" ] || out=$(mktemp -d /tmp/coc-gemm-backends.XXXXXX)
mkdir -p "$out"
shape=(--tp 2 --hidden-size 256 --num-layers 4 --num-attention-heads 8 --ffn-hidden-size 640 --seq-length 256
       --micro-batch-size 8 --global-batch-size 8 --train-iters "$iters" --no-progress)

# The median of elapsed_ms over the iterations after the first $skip, and the last loss, of a --log-json file.
summarise() {
  python3 - "$1" "$skip" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"iteration"' in l]
rows = [r for r in rows if r.get("type") == "iteration"]
ms = [r["elapsed_ms"] for r in rows[int(sys.argv[2]):]]
print(f"{statistics.median(ms):.1f} {rows[-1]['loss']:.4f}")
PY
}

for envname in env unset; do
  runenv=(env)
  [ "$envname" = unset ] && runenv=(env -u OPENBLAS_CORETYPE)
  echo "== environment: $envname (OPENBLAS_CORETYPE=$([ "$envname" = unset ] && echo unset || echo "${OPENBLAS_CORETYPE:-unset}"))"
  "${runenv[@]}" "$here/scripts/launch" -n 1 -- "$coc" bench gemm --json "$out/gemm-$envname.json"
  for r in $(seq 1 "$rounds"); do
    for be in openblas onednn; do
      f="$out/train-$envname-$be-$r.jsonl"
      "${runenv[@]}" COC_GEMM_BACKEND=$be "$here/scripts/launch" -n 2 -- "$coc" train "${shape[@]}" --log-json "$f" \
        >"$out/train-$envname-$be-$r.log" 2>&1 || die "coc train failed (log: $out/train-$envname-$be-$r.log)"
      read -r med loss < <(summarise "$f")
      printf "train %-6s round %d %-8s %8s ms/iteration  final loss %s\n" "$envname" "$r" "$be" "$med" "$loss"
    done
  done
done
echo "results: $out"
