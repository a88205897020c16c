#!/usr/bin/env bash
# The exhaustive sweep `coc tune` is judged against (issue 36, docs/tune.md): every combination of the switches tune
# walks, each measured against the run as given by the same measurement a tune step uses (`coc tune --candidate`:
# one alternating run, or pairs of whole runs for a key the trainer cannot switch between iterations and for
# pipelined runs), written as a table, best first. Not run in CI; the --dry-run listing is (tests/cli/tune.sh).
#
#   bench/tune_sweep.sh [--np 2] [--launch "CMD"] [--coc PATH] [--families a,b,...] [--iters 20] [--skip-pairs 2]
#                       [--allow-math-change] [--out TABLE.md] [--dry-run] -- TRAINING FLAGS (or --config FILE)
#
# Which switches: the families of src/cli/tune_switches.cpp that apply to the run, as `coc tune --budget 0` reports
# them (a family tune skips is left out, except one that applies once another family's value is set:
# --moe-mc2-chunks under --ep-dispatcher mc2, --coc-comm-algo under an explicit --coc-parallel-num, --delay-column-wgrad
# under --delay-wgrad-compute, --grad-reduce-in-bf16 under --bf16). Each family takes every value, not only the
# ones tune moves to; a combination that sets one key two ways (--use-mc2 with --coc-fused-kernel) is left out.
# The layout family takes every tp × cp × pp dividing the world tune reports (its JSON's "layout"), dp the rest, at
# the run's global batch (a smaller micro-batch where dp needs one); tune walks only the neighbours of its best, and turns off what a layout voids (sequence
# parallelism at tp 1, ...), which the sweep leaves to coc: a combination it refuses is a row with the reason.
# --recompute-granularity (none, selective, full) applies where tune offers it: with --memory-limit among the flags.
# --families keeps only those (names as in tune's table: use-mc2, coc-parallel-num, comm-engine, ...). The math
# changes (--gemm-backend, --comm-nonblocking-impl, --bf16, --grad-reduce-in-bf16, --cp-window-size, the layout,
# --micro-batch-size) need --allow-math-change, as in tune.
#
# --launch: the command that runs coc on the ranks, coc's arguments appended (default: scripts/launch -n NP --; on the
# shaped cluster: "scripts/cluster run --name NAME --"). --dry-run lists the combinations and how each would be
# measured, and runs nothing but the applicability check. The table: one row per combination (its keys, how it was
# measured, ms of the run and of the combination, the pairs' ratio run/combination and their IQR, peak RSS, tune's
# verdict by its keep rule); the time the sweep took is its last line, to compare with one tune's.
#
# Exit status: 0 when every combination was measured (or refused by coc with its reason, recorded in the table),
# 2 for bad arguments or a failed applicability check.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
np=2 launch="" coc="$here/build/bin/coc" families="" iters=20 skip_pairs=2 math="" table="" dry=""
script=tune_sweep
. "$here/bench/lib.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --np|--launch|--coc|--families|--iters|--skip-pairs|--out) val "$1" "${2:-}" ;;&
    --np) np=$2; shift 2 ;;
    --launch) launch=$2; shift 2 ;;
    --coc) coc=$2; shift 2 ;;
    --families) families=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --skip-pairs) skip_pairs=$2; shift 2 ;;
    --out) table=$2; shift 2 ;;
    --allow-math-change) math=--allow-math-change; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
bench_uints np iters skip_pairs
[ "$iters" -ge $((2 * (skip_pairs + 1))) ] ||
  die "--iters ($iters) leaves no timed pair after --skip-pairs $skip_pairs; use --iters $((2 * (skip_pairs + 1))) or more"
[ -f "$coc" ] && [ -x "$coc" ] || die "$coc is not an executable file; build it first (cmake --build build)"
[ -n "$launch" ] || launch="$here/scripts/launch -n $np --"
flags=("$@")

out=$(mktemp -d /tmp/coc-sweep.XXXXXX)
trap 'rm -rf "$out"' EXIT
read -r -a run <<<"$launch"
# Which families apply: tune's own decision, without measuring anything.
"${run[@]}" "$coc" tune "${flags[@]}" $math --budget 0 --no-profile --out "$out/b0.yaml" --json "$out/b0.json" \
  </dev/null >"$out/b0.log" 2>&1 || { tail -n 20 "$out/b0.log" >&2; die "coc tune --budget 0 failed on these flags (log above)"; }

python3 - "$out/b0.json" "$families" >"$out/combos" <<'PY' || die "could not list the combinations (see above)"
import itertools, json, sys
b0 = json.load(open(sys.argv[1]))
steps = b0["steps"]
only = set(filter(None, sys.argv[2].split(",")))
B = ("false", "true")
values = {  # family -> its values, each a dict of coc train keys (tune_switches.cpp's families)
    "fsdp-prefetch": [{"num-to-forward-prefetch": d, "num-to-backward-prefetch": d} for d in ("0", "1", "2")],
    "use-mc2": [{"use-mc2": "false"}, {"use-mc2": "true", "coc-fused-kernel": "false"}],
    "coc-fused-kernel": [{"coc-fused-kernel": v} for v in B],
    "ep-dispatcher": [{"ep-dispatcher": v} for v in ("eager", "fused", "mc2")],
    "moe-mc2-chunks": [{"moe-mc2-chunks": v} for v in ("1", "4")],
    "use-cp-send-recv-overlap": [{"use-cp-send-recv-overlap": v} for v in B],
    "coc-parallel-num": [{"coc-parallel-num": v} for v in ("auto", "4", "8")],
    "coc-comm-algo": [{"coc-comm-algo": v} for v in ("p2p", "collective")],
    "comm-engine": [{"comm-engine": v} for v in ("inline", "thread")],
    "comm-nonblocking-impl": [{"comm-nonblocking-impl": v} for v in ("p2p", "mpi")],
    "gemm-backend": [{"gemm-backend": v} for v in ("openblas", "onednn")],
    "data-parallel-sharding-strategy": [{"data-parallel-sharding-strategy": v}
                                        for v in ("no_shard", "optim", "optim_grads", "optim_grads_params")],
    "cp-window-size": [{"cp-window-size": v} for v in ("1", "2")],
    "micro-batch-size": [{"micro-batch-size": v} for v in ("1", "2", "4", "8")],  # coc refuses one not dividing
    "recompute-granularity": [{"recompute-granularity": "none"}, {"recompute-granularity": "selective"},
                              {"recompute-granularity": "full", "recompute-method": "uniform",
                               "recompute-num-layers": "1"}],
}
lay = b0["layout"]  # every tp × cp × pp dividing the world, dp the rest, at the run's global batch
divs = [d for d in range(1, lay["world"] + 1) if lay["world"] % d == 0]
def layout_point(t, c, p):
    # The global batch stays; a larger dp takes the largest micro-batch up to the run's that divides a rank's share,
    # as tune's layout candidates do (coc refuses the layout when dp does not divide the global batch).
    g, dp, mb = lay["global_batch_size"], lay["world"] // (t * c * p), lay["micro_batch_size"]
    while g % dp == 0 and mb > 1 and (g // dp) % mb:
        mb -= 1
    point = {"tensor-model-parallel-size": str(t), "context-parallel-size": str(c),
             "pipeline-model-parallel-size": str(p), "global-batch-size": str(g)}
    if mb != lay["micro_batch_size"]:
        point["micro-batch-size"] = str(mb)
    return point
values["layout"] = [layout_point(t, c, p) for t in divs for c in divs for p in divs if lay["world"] % (t * c * p) == 0]
for f in ("tp-comm-bulk-wgrad", "delay-wgrad-compute", "delay-column-wgrad", "attention-dense-pipeline",
          "attention-dense-backward-pipeline", "swiglu-down-pipeline", "attention-qkv-backward-pipeline",
          "swiglu-down-backward-pipeline", "overlap-forward-micro-batches", "overlap-grad-reduce",
          "overlap-p2p-communication", "bf16", "grad-reduce-in-bf16"):
    values[f] = [{f: v} for v in B]
# A family that applies only once another is set: (parent, the parent's keys it needs, tune's skip words).
needs = {"moe-mc2-chunks": ("ep-dispatcher", {"ep-dispatcher": "mc2"}, "needs --ep-dispatcher mc2"),
         "fsdp-prefetch": ("data-parallel-sharding-strategy",
                           {"data-parallel-sharding-strategy": "optim_grads_params"},
                           "need --data-parallel-sharding-strategy optim_grads_params"),
         "coc-comm-algo": ("coc-parallel-num", None, "needs an explicit --coc-parallel-num"),
         "delay-column-wgrad": ("delay-wgrad-compute", {"delay-wgrad-compute": "true"}, "--delay-wgrad-compute"),
         "grad-reduce-in-bf16": ("bf16", {"bf16": "true"}, "needs --bf16 (")}
unknown = sorted(only - set(values))
if unknown:
    sys.exit(f"tune_sweep: --families: unknown {', '.join(unknown)}; the families are {', '.join(values)}")
status = {s["family"]: s for s in steps}
def applies(f):
    s = status.get(f)
    if s is None or f not in values or (only and f not in only): return False
    if s["status"] != "skipped" or "already" in s["reason"]: return True
    if f in needs and needs[f][2] in s["reason"]: return applies(needs[f][0])
    return False
fams = [s["family"] for s in steps if applies(s["family"])]
fams = list(dict.fromkeys(fams))
# The keys coc measures by whole runs wherever they appear (alternating.cpp's is_switchable says no).
WHOLE_KEYS = ("comm-engine", "comm-nonblocking-impl", "grad-reduce-in-bf16", "overlap-p2p-communication",
              "data-parallel-sharding-strategy", "cp-window-size", "micro-batch-size", "tensor-model-parallel-size",
              "context-parallel-size", "pipeline-model-parallel-size", "global-batch-size", "sequence-parallel")
whole = any(s.get("whole_runs") for s in steps if s["status"] == "not tried" and s["family"] in fams and
            not any(k in s["keys"] for k in WHOLE_KEYS))  # a pipelined run: every one whole
def parent_ok(f, keys):
    if f not in needs or needs[f][0] not in fams: return True
    parent, want, _ = needs[f]
    if want is None:  # --coc-comm-algo: an explicit N, and neither the fused kernel nor MC2
        return keys["coc-parallel-num"] != "auto" and "true" not in (keys.get("coc-fused-kernel"), keys.get("use-mc2"))
    return all(keys.get(k) == v for k, v in want.items())
seen = set()
for choice in itertools.product(*[values[f] for f in fams]):
    keys, ok = {}, True
    for f, kv in zip(fams, choice):
        for k, v in kv.items():
            if keys.get(k, v) != v: ok = False
            keys[k] = v
    if not ok: continue
    for f, kv in zip(fams, choice):  # a dependent family without its parent: its keys are left out
        if not parent_ok(f, keys):
            for k in kv: keys.pop(k, None)
    spec = ",".join(f"{k}={v}" for k, v in keys.items())
    if not spec or spec in seen: continue
    seen.add(spec)
    w = whole or any(k in keys for k in WHOLE_KEYS)
    print(("whole runs" if w else "alternating") + "\t" + spec)
PY
n=$(wc -l <"$out/combos")
[ "$n" -gt 0 ] || die "no switch of tune's applies to this run (coc tune --budget 0 skipped them all; see its reasons)"
if [ -n "$dry" ]; then
  echo "tune_sweep: $n combination(s)"
  awk -F'\t' '{ printf "  %-12s %s\n", $1, $2 }' "$out/combos"
  exit 0
fi

start=$SECONDS
rows="$out/rows"
: >"$rows"
i=0
while IFS=$'\t' read -r how spec; do
  i=$((i + 1))
  echo "tune_sweep [$i/$n, $((SECONDS - start)) s] $spec ($how)" >&2
  "${run[@]}" "$coc" tune "${flags[@]}" $math --candidate "$spec" --tune-iters "$iters" --skip-pairs "$skip_pairs" \
    --out "$out/c.yaml" --json "$out/c.json" </dev/null >"$out/c.log" 2>&1 ||
    { tail -n 5 "$out/c.log" >&2; echo "$spec	$how	failed	see the log" >>"$rows"; continue; }
  python3 - "$out/c.json" "$spec" "$how" >>"$rows" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][-1]
print("\t".join([sys.argv[2], sys.argv[3], f"{s['ms_before']:.1f}", f"{s['ms_after']:.1f}",
                 f"{s['pair_ratio_median']:.3f}", f"{s['pair_ratio_iqr']:.3f}", f"{s['peak_rss_mib']:.0f}",
                 f"{s['status']} ({s['reason']})"]))
PY
done <"$out/combos"
{
  echo "| combination | measured by | ms run | ms combination | pairs run/comb. | IQR | peak MiB | by tune's keep rule |"
  echo "|---|---|---|---|---|---|---|---|"
  sort -t$'\t' -k5,5gr "$rows" | awk -F'\t' '{ printf "| %s |", $1; for (i = 2; i <= NF; ++i) printf " %s |", $i; print "" }'
  echo
  echo "$n combination(s) in $((SECONDS - start)) s; flags: ${flags[*]}"
} >"${table:-/dev/stdout}"
