#!/usr/bin/env bash
# coc-test-timeout: 180
# `coc plot RUN.jsonl...`: two `coc train --log-json` runs (N = 1 and N = 4) drawn into one SVG and one HTML page.
# The SVG must parse as XML with an <svg> root, and hold for each of the five metrics one polyline per run,
# labelled with the run, with one point per logged iteration; the HTML embeds it with a row per run. A run with
# evaluations (--eval-interval 3, and after training) shows its validation losses as circles on the loss chart. Bad
# input gets one error line.
source "$(dirname "$0")/common.bash"
SMALL=(--num-layers 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress --train-iters 6 --deterministic)
for n in 1 4; do
  timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" --split 80,20,0 --eval-iters 1 --eval-interval 3 \
    --coc-parallel-num $n \
    --log-json "$TMP/n$n.jsonl" \
    >/dev/null 2>"$TMP/train$n.err" || { echo "FAIL train N=$n"; tail -3 "$TMP/train$n.err"; fails=$((fails + 1)); }
done
"$COC" plot "$TMP/n1.jsonl" "$TMP/n4.jsonl" -o "$TMP/plot" >"$TMP/plot.out" 2>&1
check "coc plot exits 0 and lists both files" test "$(grep -c '^wrote ' "$TMP/plot.out")" -eq 2
python3 - "$TMP/plot.svg" "$TMP/plot.html" >"$TMP/check.out" 2>&1 <<'PY'
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == ns + "svg", root.tag
lines = root.findall(".//%spolyline" % ns)
series = {(p.get("data-metric"), p.get("data-run")): p.get("points").split() for p in lines}
metrics = ["loss", "lr", "grad_norm", "elapsed_ms", "tokens_per_s"]
want = {(m, r) for m in metrics for r in ("N=1", "N=4")}
assert set(series) == want, sorted(series)
for key, pts in series.items():
    assert len(pts) == 6, (key, len(pts))
    xs = [float(p.split(",")[0]) for p in pts]
    assert xs == sorted(xs) and len(set(xs)) == 6, (key, xs)
# --deterministic: N = 1 and N = 4 have the same losses, so the same loss points.
assert series[("loss", "N=1")] == series[("loss", "N=4")]
# Each run's evaluations at iterations 3 and 6 and after training (6 again): three circles per run, at the same
# places for both (the same weights).
circles = root.findall(".//%scircle[@class='validation']" % ns)
assert [c.get("data-run") for c in circles] == ["N=1"] * 3 + ["N=4"] * 3, [c.get("data-run") for c in circles]
at = [(c.get("cx"), c.get("cy")) for c in circles]
assert at[:3] == at[3:] and at[1] == at[2] and float(at[1][0]) > float(at[0][0]), at
legend = [t.text for t in root.iter(ns + "text")]
assert "N=1" in legend and "N=4" in legend, legend
html = open(sys.argv[2]).read()
assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
assert html.count("<tr><td>N=") == 2
print("ok: %d polylines" % len(lines))
PY
check "the SVG parses and holds 5 metrics x 2 labelled runs of 6 points; the HTML is self-contained" test $? -eq 0
sed 's/^/    /' "$TMP/check.out" | tail -3
"$COC" plot "$TMP/n1.jsonl" --label "serial" --svg - --html "$TMP/one.html" >"$TMP/stdout.svg" 2>&1
check "--svg - writes the SVG to stdout, --label names the run" bash -c "head -c 4 '$TMP/stdout.svg' | grep -q '<svg' && grep -q 'data-run=\"serial\"' '$TMP/stdout.svg'"
check "'-' reads the JSON lines from stdin" bash -c "'$COC' plot - --svg - --html '$TMP/stdin.html' <'$TMP/n4.jsonl' | grep -q 'data-run=\"N=4\"'"

plot_error() {  # plot_error NAME REGEX ARGS...
  local name="$1" pattern="$2"; shift 2
  "$COC" plot "$@" >/dev/null 2>"$TMP/$name.err"
  local rc=$?
  if [ $rc -ne 0 ] && [ "$(grep -c 'coc: error:' "$TMP/$name.err")" -eq 1 ] && grep -Eq -e "$pattern" "$TMP/$name.err"; then
    echo "ok   $name: $(head -1 "$TMP/$name.err" | cut -c1-150)"; passes=$((passes + 1))
  else
    echo "FAIL $name (exit $rc):"; sed 's/^/    /' "$TMP/$name.err"; fails=$((fails + 1))
  fi
}
echo 'not json' >"$TMP/bad.jsonl"
echo '{"type":"run"}' >"$TMP/empty.jsonl"
plot_error not_json "bad.jsonl:1: not a JSON line" "$TMP/bad.jsonl" -o "$TMP/x"
plot_error no_iterations "empty.jsonl: no iteration record" "$TMP/empty.jsonl" -o "$TMP/x"
plot_error missing "nope.jsonl: no such file" "$TMP/nope.jsonl" -o "$TMP/x"
plot_error labels "1 --label for 2 file" "$TMP/n1.jsonl" "$TMP/n4.jsonl" --label a -o "$TMP/x"
plot_error no_files "needs at least one file" -o "$TMP/x"
finish
