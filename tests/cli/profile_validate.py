#!/usr/bin/env python3
"""Strict check of a coc trace against the rules Perfetto's JSON importer (and chrome://tracing) enforce, plus
coc's own contract (docs/profiling.md). Used by tests/cli/profile.sh; not a test itself (CTest runs only *.sh).

No offline Perfetto importer is available from the Debian or npm registries (the `perfetto` Python package fetches
its trace_processor binary from the network), so the importer's rules are spelled out here:
  - the document is a JSON object with a "traceEvents" array (no NaN/Infinity: strict JSON);
  - every event has a string "ph"; pid and tid are integers; "X" events have a string name, numeric ts and
    dur >= 0; "M" events are known metadata names with an args object;
  - the X slices of one (pid, tid) track are strictly nested or disjoint (misnested slices are import errors).
Then coc's contract: one process per rank + one "Overlap Analysis" process per rank with the four lanes; the
lanes equal a recomputation from the rank's compute/comm events inside its ProfilerStep windows and sum to them.

Usage: profile_validate.py TRACE.json EXPECTED_RANKS EXPECTED_STEPS_PER_RANK [VERBOSE_LOG]
With VERBOSE_LOG (stderr of `coc train -v`), also checks that per rank and step the GEMM events of the CoC ops
(args.op set) sum to the "-v" GEMM time within 2%. Prints one line per check; exit 1 on the first failure.
"""
import json
import math
import re
import sys
from collections import defaultdict

OVERLAP_PID_BASE = 1000000
LANES = ["Computing", "Communication", "Communication(Not Overlapped)", "Free"]
META = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}


def fail(msg):
    print("FAIL", msg)
    sys.exit(1)


def ns(v):
    return int(round(v * 1000.0))


def union(iv):
    out = []
    for b, e in sorted(x for x in iv if x[1] > x[0]):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def measure(u):
    return sum(e - b for b, e in u)


def clip(u, w):
    return [[max(b, w[0]), min(e, w[1])] for b, e in u if min(e, w[1]) > max(b, w[0])]


def subtract(a, b):
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append([cur, bs])
            cur = max(cur, be)
        if cur < e:
            out.append([cur, e])
    return out


def main():
    path, want_ranks, want_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    vlog = sys.argv[4] if len(sys.argv) > 4 else None

    def reject(c):
        fail(f"non-finite number {c} in the JSON")

    with open(path) as f:
        doc = json.load(f, parse_constant=reject)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("not an object with a traceEvents array")
    other = doc.get("otherData", {})
    if other.get("producer") != "coc":
        fail("otherData.producer is not coc")
    tracks = defaultdict(list)
    names = {}
    per_rank = defaultdict(lambda: {"C": [], "M": [], "steps": [], "gemm": [], "lanes": defaultdict(list)})
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if not isinstance(ph, str):
            fail(f"event without a string ph: {e}")
        for k in ("pid", "tid"):
            if not isinstance(e.get(k), int) or isinstance(e.get(k), bool):
                fail(f"{k} is not an integer: {e}")
        if ph == "M":
            if e.get("name") not in META or not isinstance(e.get("args"), dict):
                fail(f"unknown metadata event: {e}")
            if e["name"] in ("process_name", "thread_name"):
                names[(e["pid"], e["tid"] if e["name"] == "thread_name" else None)] = e["args"].get("name")
            continue
        if ph != "X":
            fail(f"unexpected phase {ph}: coc writes only X and M events")
        if not isinstance(e.get("name"), str) or not isinstance(e.get("cat"), str):
            fail(f"X event without string name/cat: {e}")
        ts, dur = e.get("ts"), e.get("dur")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (ts, dur)):
            fail(f"ts/dur not finite numbers: {e}")
        if dur < 0 or ts < 0:
            fail(f"negative ts or dur: {e}")
        if not isinstance(e.get("args", {}), dict):
            fail(f"args is not an object: {e}")
        b, d = ns(ts), ns(dur)
        tracks[(e["pid"], e["tid"])].append((b, b + d))
        pid, cat = e["pid"], e["cat"]
        if pid >= OVERLAP_PID_BASE:
            if cat != "overlap_analysis" or e["name"] not in LANES:
                fail(f"unexpected event in an Overlap Analysis process: {e}")
            per_rank[pid - OVERLAP_PID_BASE]["lanes"][e["name"]].append([b, b + d])
            continue
        r = per_rank[pid]
        if cat == "compute":
            r["C"].append([b, b + d])
            if e["name"] == "gemm" and "op" in e.get("args", {}):
                r["gemm"].append((b, b + d))
        elif cat == "comm":
            r["M"].append([b, b + d])
            # A pipeline stage's wait for a receive (pp_recv_wait, on "comm pp") is no collective: no bytes nor seq.
            for k in ("op", "comm") if e["name"] == "pp_recv_wait" else ("op", "bytes", "seq", "comm"):
                if k not in e["args"]:
                    fail(f"comm event without args.{k}: {e}")
        elif cat == "step":
            m = re.fullmatch(r"ProfilerStep#(\d+)", e["name"])
            if not m:
                fail(f"step event not named ProfilerStep#N: {e['name']}")
            r["steps"].append((int(m.group(1)), b, b + d))
    print(f"ok   {len(doc['traceEvents'])} events parse as strict JSON with valid ph/pid/tid/ts/dur and metadata")

    for (pid, tid), sl in tracks.items():
        sl.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for b, e in sl:
            while stack and stack[-1] <= b:
                stack.pop()
            if stack and e > stack[-1]:
                fail(f"misnested slice [{b}, {e}) on pid {pid} tid {tid} (encloser ends {stack[-1]})")
            stack.append(e)
        if (pid, tid) not in names:
            fail(f"track pid {pid} tid {tid} has no thread_name")
    print(f"ok   {len(tracks)} tracks, every one named and strictly nested")

    ranks = sorted(r for r in per_rank if per_rank[r]["steps"])
    if len(ranks) != want_ranks:
        fail(f"{len(ranks)} ranks with steps, expected {want_ranks}")
    for r in ranks:
        d = per_rank[r]
        if names.get((r, None)) != f"rank {r}" or names.get((OVERLAP_PID_BASE + r, None)) != f"Overlap Analysis (rank {r})":
            fail(f"rank {r}: process names missing")
        if len(d["steps"]) != want_steps:
            fail(f"rank {r}: {len(d['steps'])} steps, expected {want_steps}")
        C, M = union(d["C"]), union(d["M"])
        W = union([[b, e] for _, b, e in d["steps"]])
        want = {"Computing": union(sum((clip(C, w) for w in W), [])),
                "Communication": union(sum((clip(M, w) for w in W), [])),
                "Communication(Not Overlapped)": union(sum((clip(subtract(M, C), w) for w in W), [])),
                "Free": subtract(W, union(C + M))}
        total = measure(W)
        got = {k: measure(union(d["lanes"][k])) for k in LANES}
        for k in LANES:
            if got[k] != measure(want[k]):
                fail(f"rank {r}: lane {k} covers {got[k]} ns, recomputed {measure(want[k])} ns")
        if got["Computing"] + got["Communication(Not Overlapped)"] + got["Free"] != total:
            fail(f"rank {r}: lanes do not sum to the step windows ({total} ns)")
        print(f"ok   rank {r}: {want_steps} steps, {total / 1e6:.3f} ms; lanes = recomputation: "
              + ", ".join(f"{k} {got[k] / 1e6:.3f} ms" for k in LANES))

    if vlog:
        gemm_ms = {}
        for line in open(vlog, errors="replace"):
            m = re.search(r"\[rank (\d+)\] iteration (\d+): GEMM ([0-9.]+) ms", line)
            if m:
                gemm_ms[(int(m.group(1)), int(m.group(2)))] = float(m.group(3))
        for r in ranks:
            tr_total = vb_total = 0.0
            for it, b, e in per_rank[r]["steps"]:
                s = sum(ge - gb for gb, ge in per_rank[r]["gemm"] if gb >= b and ge <= e) / 1e6
                if (r, it + 1) not in gemm_ms:
                    fail(f"rank {r}: no -v GEMM line for iteration {it + 1}")
                tr_total += s
                vb_total += gemm_ms[(r, it + 1)]
            rel = abs(tr_total - vb_total) / max(vb_total, 1e-9)
            msg = f"rank {r}: GEMM events of the CoC ops {tr_total:.2f} ms vs -v GEMM timer {vb_total:.2f} ms ({100 * rel:.2f}%)"
            if rel > 0.02:
                fail(msg + " > 2%")
            print("ok  ", msg)
    print("ok   all checks")


if __name__ == "__main__":
    main()
