#!/usr/bin/env bash
# coc-test-timeout: 240
# `coc train --log-json FILE --tensorboard-dir DIR` on 2 ranks: every JSON line parses and holds the log line's
# fields and both ranks' timings; the TensorBoard event file decodes, record by record (both masked CRC32Cs
# checked), with a decoder that protoc generates from tests/cli/tensorboard_event.proto (Debian's protobuf, not
# coc's encoder), and its scalars are the JSON's: Megatron's names, "throughput" in TFLOP/s per rank, tokens/s as
# "tokens-per-second", each evaluation (every --eval-interval, and after training on the validation and the test
# split) as Megatron's "lm loss validation" tags. Both are written as training goes: after kill -9 of a rank
# mid-run, the lines written so far are complete. `--log-json -` writes only JSON to stdout, the log to stderr, and
# `coc train ... --log-json - | coc plot -` draws it. --skip-train's evaluations go to the JSON, not to TensorBoard
# (Megatron's); a MoE run's records hold load_balancing_loss.
source "$(dirname "$0")/common.bash"
SMALL=(--num-layers 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress)

EVAL=(--split 80,10,10 --eval-iters 1)
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 5 --log-interval 2 "${SMALL[@]}" "${EVAL[@]}" \
  --eval-interval 2 --log-json "$TMP/run.jsonl" --tensorboard-dir "$TMP/tb" >"$TMP/out" 2>"$TMP/err"
rc=$?
check "train with --log-json and --tensorboard-dir exits 0 (got $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$TMP/err"

# Debian's python3-protobuf belongs to Debian's python3 (a python3 earlier in PATH, e.g. pyenv's, lacks it).
PYPB=python3; [ -x /usr/bin/python3 ] && PYPB=/usr/bin/python3
if ! command -v protoc >/dev/null || ! "$PYPB" -c 'import google.protobuf' 2>/dev/null; then
  echo "FAIL protoc or python3-protobuf missing: run scripts/setup (Debian: protobuf-compiler python3-protobuf)"
  fails=$((fails + 1))
else
  protoc --proto_path="$ROOT/tests/cli" --python_out="$TMP" "$ROOT/tests/cli/tensorboard_event.proto"
  cat >"$TMP/check_metrics.py" <<'PY'
import glob, json, math, struct, sys
sys.path.insert(0, sys.argv[1])
import tensorboard_event_pb2 as pb

jsonl, tbdir = sys.argv[2], sys.argv[3]
# JSON lines: a "run" record, then iterations 2, 4 and 5 (every --log-interval 2, and the last).
recs = [json.loads(line) for line in open(jsonl)]
assert recs[0]["type"] == "run" and recs[0]["world_size"] == 2, recs[0]
its = [r for r in recs[1:] if r["type"] == "iteration"]
assert [r["iteration"] for r in its] == [2, 4, 5], [r["iteration"] for r in its]
for r in its:
    for k in ("loss", "lr", "grad_norm", "elapsed_ms", "tokens_per_s", "tflops_per_rank", "baseline", "train_iters",
              "wall_time"):
        assert k in r, (k, r)
    assert r["loss"] > 0 and r["elapsed_ms"] > 0 and r["tokens_per_s"] > 0 and r["tflops_per_rank"] > 0, r
    assert "load_balancing_loss" not in r, "a dense model has no load-balancing loss"
# Evaluations: every --eval-interval 2, then after training on the validation and the test split.
evals = [r for r in recs if r["type"] == "evaluation"]
assert [(e["iteration"], e["split"], e["at_end"]) for e in evals] == [
    (2, "validation", False), (4, "validation", False), (5, "validation", True), (5, "test", True)], evals
for e in evals:
    assert e["loss"] > 0 and abs(e["ppl"] - math.exp(min(20, e["loss"]))) < 1e-9 * e["ppl"], e
    assert [x["rank"] for x in r["ranks"]] == [0, 1], r["ranks"]
    for x in r["ranks"]:
        assert x["gemm_ms"] > 0 and x["comm_wait_ms"] >= 0 and x["exposed_comm_ms"] >= x["comm_wait_ms"] - 1e-3, x
        assert x["max_rss_mib"] > 1, x

# TFRecord framing with CRC-32C (Castagnoli), computed here bit by bit.
def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

files = glob.glob(tbdir + "/events.out.tfevents.*")
assert len(files) == 1, files
raw = open(files[0], "rb").read()
events, off = [], 0
while off < len(raw):
    hdr = raw[off:off + 8]
    (n,) = struct.unpack("<Q", hdr)
    (hcrc,) = struct.unpack("<I", raw[off + 8:off + 12])
    assert hcrc == masked(hdr), "length CRC at %d" % off
    payload = raw[off + 12:off + 12 + n]
    (pcrc,) = struct.unpack("<I", raw[off + 12 + n:off + 16 + n])
    assert pcrc == masked(payload), "payload CRC at %d" % off
    ev = pb.Event()
    ev.ParseFromString(payload)
    events.append(ev)
    off += 16 + n
assert events[0].file_version == "brain.Event:2", events[0]
scalars, series = {}, {}
for ev in events[1:]:
    assert ev.wall_time > 1.6e9, ev
    for v in ev.summary.value:
        scalars.setdefault(v.tag, {})[ev.step] = v.simple_value
        series.setdefault(v.tag, []).append((ev.step, v.simple_value))
want = {"lm loss": "loss", "learning-rate": "lr", "grad-norm": "grad_norm", "throughput": "tflops_per_rank",
        "tokens-per-second": "tokens_per_s"}
validation_tags = {"lm loss validation", "lm loss validation vs samples", "lm loss validation ppl",
                   "lm loss validation ppl vs samples"}
assert set(scalars) == set(want) | {"iteration-time"} | validation_tags, sorted(scalars)
# Megatron's evaluate_and_print_results: the test split is written under the same tags, after the validation one.
def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))
for tag, key, x in (("lm loss validation", "loss", 1), ("lm loss validation vs samples", "loss", 4),
                    ("lm loss validation ppl", "ppl", 1), ("lm loss validation ppl vs samples", "ppl", 4)):
    got = series[tag]
    assert [s for s, _ in got] == [e["iteration"] * x for e in evals], (tag, got)
    assert all(close(v, e[key]) for (_, v), e in zip(got, evals)), (tag, got)
for tag, key in want.items():
    for r in its:
        got = scalars[tag][r["iteration"]]
        assert abs(got - r[key]) <= 1e-5 * max(1.0, abs(r[key])), (tag, r["iteration"], got, r[key])
for r in its:
    assert abs(scalars["iteration-time"][r["iteration"]] - r["elapsed_ms"] / 1000) < 1e-6 * r["elapsed_ms"] + 1e-7
print("ok: %d JSON records, %d events, scalars %s" % (len(recs), len(events), ", ".join(sorted(scalars))))
PY
  "$PYPB" "$TMP/check_metrics.py" "$TMP" "$TMP/run.jsonl" "$TMP/tb" >"$TMP/check.out" 2>&1
  rc=$?
  check "JSON lines parse and the event file decodes to the same scalars (protoc + python3-protobuf)" test $rc -eq 0
  sed 's/^/    /' "$TMP/check.out" | tail -4
fi

# Written as it goes: kill -9 one rank once two iterations are logged; every line written so far parses.
"$LAUNCH" -n 2 -- "$COC" train --train-iters 100000 "${SMALL[@]}" --log-json "$TMP/killed.jsonl" \
  --tensorboard-dir "$TMP/tb_killed" >"$TMP/kout" 2>"$TMP/kerr" &
job=$!
for _ in $(seq 1 600); do
  n=$(grep -c '"type":"iteration"' "$TMP/killed.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 2 ] && break
  sleep 0.1
done
victim=$(pgrep -f "coc train --train-iters 100000" | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
check "the killed run exits non-zero" test $? -ne 0
check "the killed run's JSON lines all parse (>= 2 iterations)" python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["type"] == "iteration" for r in recs) >= 2' "$TMP/killed.jsonl"
check "the killed run's event file holds whole records" python3 -c '
import glob, struct, sys
raw = open(glob.glob(sys.argv[1] + "/events.out.tfevents.*")[0], "rb").read()
off = 0
while off < len(raw):
    off += 16 + struct.unpack("<Q", raw[off:off + 8])[0]
assert off == len(raw) and len(raw) > 100' "$TMP/tb_killed"

# --log-json -: standard output holds the records alone (the log lines, evaluations and the sample go to stderr),
# so that coc plot - reads it from a pipe.
STDOUT_RUN=(--num-layers 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
            --micro-batch-size 2 --global-batch-size 4 --sample-length 8 --train-iters 2 "${EVAL[@]}")
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${STDOUT_RUN[@]}" --log-json - >"$TMP/stdout" 2>"$TMP/stderr"
check "--log-json -: stdout is JSON lines only (2 iterations, 2 evaluations)" python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
types = [r["type"] for r in recs]
assert types == ["run", "iteration", "iteration", "evaluation", "evaluation"], types' "$TMP/stdout"
check "--log-json -: the log, the evaluations and the sample are on stderr" bash -c "
  test \$(grep -c '^ iteration' '$TMP/stderr') -eq 2 && grep -q 'on test set | lm loss value' '$TMP/stderr' &&
  grep -q -- '--- sample ---' '$TMP/stderr'"
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${STDOUT_RUN[@]}" --log-json - 2>/dev/null |
  "$COC" plot - -o "$TMP/piped" >"$TMP/plot.out" 2>&1
check "coc train ... --log-json - | coc plot - (exit ${PIPESTATUS[0]} | ${PIPESTATUS[1]})" \
  test "${PIPESTATUS[0]}${PIPESTATUS[1]}" = 00 -a -s "$TMP/piped.svg" -a -s "$TMP/piped.html"

# --skip-train: the evaluations are JSON records; TensorBoard gets none (Megatron's write_to_tensorboard=False).
timeout 120 "$LAUNCH" -n 2 -- "$COC" train "${SMALL[@]}" "${EVAL[@]}" --skip-train --log-json "$TMP/skip.jsonl" \
  --tensorboard-dir "$TMP/tb_skip" >/dev/null 2>"$TMP/skip.err"
check "--skip-train: two evaluation records at iteration 0, no TensorBoard scalar" python3 -c '
import glob, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ev = [(r["iteration"], r["split"]) for r in recs if r["type"] == "evaluation"]
assert ev == [(0, "validation"), (0, "test")], ev
assert b"lm loss" not in open(glob.glob(sys.argv[2] + "/events.out.tfevents.*")[0], "rb").read()' \
  "$TMP/skip.jsonl" "$TMP/tb_skip"

# MoE: load_balancing_loss in every iteration record and in TensorBoard.
timeout 120 "$LAUNCH" -n 1 -- "$COC" train --train-iters 2 "${SMALL[@]}" --num-experts 4 \
  --log-json "$TMP/moe.jsonl" --tensorboard-dir "$TMP/tb_moe" >/dev/null 2>"$TMP/moe.err"
check "MoE: load_balancing_loss in the JSON records and the event file" python3 -c '
import glob, json, sys
its = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "iteration"]
assert len(its) == 2 and all(r["load_balancing_loss"] > 0 for r in its), its
assert b"load_balancing_loss" in open(glob.glob(sys.argv[2] + "/events.out.tfevents.*")[0], "rb").read()' \
  "$TMP/moe.jsonl" "$TMP/tb_moe"
expect_error log_json_unwritable "--log-json $TMP/no/such/dir/x.jsonl: cannot write" 2 -- train --train-iters 1 \
  "${SMALL[@]}" --log-json "$TMP/no/such/dir/x.jsonl"
finish
