#!/usr/bin/env python3
"""Writes small PyTorch CPU-only profiler traces for tests/cli/analyze_torch_cpu.sh, so that the test runs from the
repository alone (no ../shared beside it):

  OUT/torch_cpu_gloo_tp2/rank{0,1}.pt.trace.json.gz  PyTorch 1.13's layout for a CPU-only gloo run: a bare JSON array,
      pid "CPU functions", integer µs; aten operators (nested) on the main thread (tid 1), c10d::allreduce_ there
      while it waits, gloo:all_reduce on gloo's worker threads (tid 2, 3); ProfilerStep#2..#4; rank in the file name.

The other layout, Kineto's object with cpu_op / user_annotation events (HTA's cpu_only sample), is the committed
fixture tests/analysis/data/kineto/cpu_only (tests/analysis/data/make_kineto_fixtures.py), which the analysis tests
share.

Made up here, not copied: the durations come from a seeded generator, so the files are the same on every run.
Usage: make_torch_cpu_traces.py OUT
"""
import gzip
import json
import os
import random
import sys


def gloo_rank(rank):
    """Three profiled steps of a TP=2 decoder on one rank: compute blocks, then a blocking all-reduce."""
    rng = random.Random(1234 + rank)
    ev = []

    def op(name, ts, dur, tid=1):
        ev.append({"name": name, "ph": "X", "ts": ts, "dur": dur, "tid": tid, "pid": "CPU functions", "args": {}})

    op("aten::zeros", 145, 59)
    op("aten::empty", 181, 4)
    op("c10d::barrier", 1009, 24)
    op("gloo:barrier", 1087, 115, tid=2)
    t = 1300
    for step in (2, 3, 4):
        start = t
        t += 50
        for block in range(6):
            linear = rng.randint(2000, 4000)  # a linear layer: GEMM, bias-free add, a view
            op("aten::linear", t, linear)
            op("aten::t", t + 5, 10)
            op("aten::mm", t + 20, linear - 200)
            op("aten::add", t + linear - 150, 120)
            t += linear + rng.randint(10, 40)
            silu = rng.randint(300, 800)
            op("aten::silu", t, silu)
            t += silu + 10
            op("c10d::allreduce_", t, 30)  # the main thread posts the all-reduce and waits for gloo's thread
            gloo = rng.randint(300, 900)
            op("gloo:all_reduce", t + 60, gloo, tid=2 + block % 2)
            t += 60 + gloo + rng.randint(20, 60)
        op("ProfilerStep#%d" % step, start, t - start)
        t += 100
    return ev


def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(obj).encode())


def main():
    out = sys.argv[1]
    for rank in (0, 1):
        write(os.path.join(out, "torch_cpu_gloo_tp2", "rank%d.pt.trace.json.gz" % rank), gloo_rank(rank))


if __name__ == "__main__":
    main()
