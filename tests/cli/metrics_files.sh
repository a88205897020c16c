#!/usr/bin/env bash
# coc-test-timeout: 240
# `coc train --log-json FILE --tensorboard-dir DIR` on 2 ranks: every JSON line parses and holds the log line's
# fields and both ranks' timings; the TensorBoard event file decodes, record by record (both masked CRC32Cs
# checked), with a decoder that protoc generates from tests/cli/tensorboard_event.proto (Debian's protobuf, not
# coc's encoder), and its scalars are the JSON's. Both are written as training goes: after kill -9 of a rank
# mid-run, the lines written so far are complete. `--log-json -` writes to stdout.
source "$(dirname "$0")/common.bash"
SMALL=(--num-layers 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 32
       --micro-batch-size 2 --global-batch-size 4 --sample-length 0 --no-progress)

timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 5 --log-interval 2 "${SMALL[@]}" \
  --log-json "$TMP/run.jsonl" --tensorboard-dir "$TMP/tb" >"$TMP/out" 2>"$TMP/err"
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
import glob, json, struct, sys
sys.path.insert(0, sys.argv[1])
import tensorboard_event_pb2 as pb

jsonl, tbdir = sys.argv[2], sys.argv[3]
# JSON lines: a "run" record, then iterations 2, 4 and 5 (every --log-interval 2, and the last).
recs = [json.loads(line) for line in open(jsonl)]
assert recs[0]["type"] == "run" and recs[0]["world_size"] == 2, recs[0]
its = [r for r in recs[1:] if r["type"] == "iteration"]
assert [r["iteration"] for r in its] == [2, 4, 5], [r["iteration"] for r in its]
for r in its:
    for k in ("loss", "lr", "grad_norm", "elapsed_ms", "tokens_per_s", "baseline", "train_iters", "wall_time"):
        assert k in r, (k, r)
    assert r["loss"] > 0 and r["elapsed_ms"] > 0 and r["tokens_per_s"] > 0, r
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
scalars = {}
for ev in events[1:]:
    assert ev.wall_time > 1.6e9, ev
    for v in ev.summary.value:
        scalars.setdefault(v.tag, {})[ev.step] = v.simple_value
want = {"lm loss": "loss", "learning-rate": "lr", "grad-norm": "grad_norm", "throughput": "tokens_per_s"}
assert set(scalars) == set(want) | {"iteration-time"}, sorted(scalars)
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

# --log-json - writes the records to stdout, between the log lines.
timeout 120 "$LAUNCH" -n 2 -- "$COC" train --train-iters 2 "${SMALL[@]}" --log-json - >"$TMP/stdout" 2>/dev/null
check "--log-json - writes JSON lines to stdout" test "$(grep -c '^{"type":"iteration"' "$TMP/stdout")" -eq 2
expect_error log_json_unwritable "--log-json $TMP/no/such/dir/x.jsonl: cannot write" 2 -- train --train-iters 1 \
  "${SMALL[@]}" --log-json "$TMP/no/such/dir/x.jsonl"
finish
