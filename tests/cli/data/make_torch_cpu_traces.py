#!/usr/bin/env python3
"""Writes small PyTorch CPU-only profiler traces, in the two layouts PyTorch writes, for tests/cli/analyze_torch_cpu.sh,
so that the test runs from the repository alone (no ../shared beside it):

  OUT/torch_cpu_gloo_tp2/rank{0,1}.pt.trace.json.gz  PyTorch 1.13's layout for a CPU-only gloo run: a bare JSON array,
      pid "CPU functions", integer µs; aten operators (nested) on the main thread (tid 1), c10d::allreduce_ there
      while it waits, gloo:all_reduce on gloo's worker threads (tid 2, 3); ProfilerStep#2..#4; rank in the file name.
  OUT/cpu_only/rank-34.<time>.<pid>.pt.trace.json.gz  Kineto's layout (HTA's cpu_only sample): a traceEvents object
      with distributedInfo (rank 34 of 300), fractional µs, metadata events, cpu_op and user_annotation categories,
      one ProfilerStep and gloo:all_reduce on two worker threads.

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


def cpu_only():
    """Kineto's object layout: one ProfilerStep with two gloo worker threads busy inside it."""
    rng = random.Random(34)
    base = 1212075525586.016
    pid, main = 1074, 1074
    meta = [{"name": "process_name", "ph": "M", "ts": base, "pid": pid, "tid": 0, "args": {"name": "trainer"}},
            {"name": "process_labels", "ph": "M", "ts": base, "pid": pid, "tid": 0, "args": {"labels": "CPU"}}]
    for tid in (main, 3553, 3554):
        meta.append({"name": "thread_name", "ph": "M", "ts": base, "pid": pid, "tid": tid,
                     "args": {"name": "thread %d (pt_main_thread)" % tid}})
    ev = []
    step_ts = base + 4290.801
    t = step_ts + 20.0
    for i in range(5):
        for tid in (3553, 3554):
            dur = round(rng.uniform(150000, 380000), 3)
            ev.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid, "tid": tid,
                       "ts": round(t + rng.uniform(0, 9000), 3), "dur": dur,
                       "args": {"External id": 1025 + i, "Ev Idx": i}})
        t += 420000.0
    step_dur = round(t - step_ts - 15000.0, 3)
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#551", "pid": pid, "tid": main,
               "ts": round(step_ts, 3), "dur": step_dur, "args": {"External id": 1}})
    for k in range(4):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": pid, "tid": main,
                   "ts": round(step_ts + step_dur + 1000.0 + 7 * k, 3), "dur": round(rng.uniform(0.4, 2.5), 3),
                   "args": {"External id": 2000 + k}})
    ev.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
               "ts": base, "dur": round(step_dur + 20000.0, 3), "args": {}})
    ev.append({"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
               "tid": "Trace PyTorch Profiler", "ts": base})
    return {"schemaVersion": 1, "deviceProperties": [],
            "distributedInfo": {"backend": "gloo", "rank": 34, "world_size": 300},
            "traceEvents": meta + ev, "traceName": "rank-34.pt.trace.json", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1721036000000000000}


def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(obj).encode())


def main():
    out = sys.argv[1]
    for rank in (0, 1):
        write(os.path.join(out, "torch_cpu_gloo_tp2", "rank%d.pt.trace.json.gz" % rank), gloo_rank(rank))
    write(os.path.join(out, "cpu_only", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"), cpu_only())


if __name__ == "__main__":
    main()
