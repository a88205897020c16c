#!/usr/bin/env python3
"""Writes coc's synthetic Kineto fixtures (tests/analysis/data/kineto/<name>/*.json.gz) and the figures expected of
them (tests/analysis/data/kineto_expected.json), so that the trace-analysis tests run from the repository alone.

Each fixture is written for coc, event by event, in the layout of the public trace of the same folder name under
../shared/traces/kineto (shared/traces/README.md says which); none is copied or derived from those files. The
expected figures below were worked out BY HAND from the events listed here, under HTA's conventions as
Convention::kHta implements them (src/analysis/metrics_hta.cpp): each device event is trimmed inward to whole µs
(begin = ceil(ts), end = floor(ts + dur)), the last ProfilerStep is dropped (its launch calls, and the device events
they launched) when a trace has two or more, and sync records are neither compute nor communication but still
busy time. kineto_expected.json follows the schema of shared/traces/hta_anchor_values.json, so that
tests/analysis/test_hta_anchors.cpp checks both files with the same code.

All times are written as exact decimal text (never through a Python float), so the ns digits in the files are the
ones written here. Fractional µs are multiples of 1/8: exact in a double, so HTA's double-based rounding of
ts + dur is the rounding of the exact sum.

Usage: make_kineto_fixtures.py [OUT]   (OUT defaults to this script's folder; the output is byte-for-byte stable)
"""
import gzip
import os
import sys
from decimal import Decimal

EXPECTED = {}


# ---- writing -------------------------------------------------------------------------------------------------------

def dumps(v):
    """JSON text with Decimals written as their exact digits (json.dumps would route them through a float)."""
    if isinstance(v, dict):
        return "{" + ", ".join('"%s": %s' % (k, dumps(x)) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(dumps(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, Decimal):
        s = str(v)
        assert "E" not in s, s
        return s
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    assert isinstance(v, str), v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_trace(out, folder, file_name, header, events):
    """Kineto's layout: the header keys, then "traceEvents" with one event per line."""
    path = os.path.join(out, "kineto", folder, file_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = ["{"] + ['  "%s": %s,' % (k, dumps(v)) for k, v in header.items()]
    lines += ['  "traceEvents": [']
    lines += ["    " + dumps(e) + ("," if i + 1 < len(events) else "") for i, e in enumerate(events)]
    lines += ["  ]", "}", ""]
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write("\n".join(lines).encode())


def t(base, offset):
    """An absolute µs timestamp: base + offset, both exact decimal text."""
    return Decimal(str(base)) + Decimal(str(offset))


# ---- event helpers (the fields Kineto writes) ----------------------------------------------------------------------

def ev(cat, name, pid, tid, ts, dur, args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": Decimal(str(dur)),
            "args": args}


def kernel(name, ts, dur, corr, stream, cat="kernel", device=0, **extra):
    args = {"External id": corr, "queued": 0, "device": device, "context": 1, "stream": stream,
            "correlation": corr}
    args.update(extra)
    return ev(cat, name, device, stream, ts, dur, args)


CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51, "cudaStreamSynchronize": 131,
        "cudaEventRecord": 135, "cudaEventSynchronize": 137, "cudaStreamWaitEvent": 147, "cudaDeviceSynchronize": 165}


def runtime(name, ts, dur, corr, pid, tid, cat="cuda_runtime"):
    return ev(cat, name, pid, tid, ts, dur, {"External id": corr, "cbid": CBID[name], "correlation": corr})


def step(n, ts, dur, pid, tid, ext):
    return ev("user_annotation", "ProfilerStep#%d" % n, pid, tid, ts, dur,
              {"External id": ext, "Record function id": ext, "Ev Idx": ext})


def cpu_op(name, ts, dur, pid, tid, ext, cat="cpu_op"):
    return ev(cat, name, pid, tid, ts, dur, {"External id": ext, "Record function id": ext, "Ev Idx": ext})


def process_meta(pid, name, labels):
    return [{"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"labels": labels}}]


def profiler_span(ts, dur):
    # The profiler's own span (cat "Trace") and the iteration marker Kineto adds: neither is an operator.
    return [{"ph": "X", "cat": "Trace", "ts": ts, "dur": Decimal(str(dur)), "pid": "Spans", "tid": "PyTorch Profiler",
             "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "PyTorch Profiler", "ts": ts}]


def flow(corr, ts_start, ts_end, host_pid, host_tid, stream):
    # Kineto's launch -> kernel arrows (cat "ac2g"): coc links by args.correlation and ignores these.
    return [{"ph": "s", "id": corr, "pid": host_pid, "tid": host_tid, "ts": ts_start, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": ts_end, "cat": "ac2g", "name": "ac2g", "bp": "e"}]


A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85198045184, "computeMajor": 8,
         "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 108}]
GEMM = "volta_sgemm_128x64_nn"
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
          "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, "
          "float, float>, unsigned int, float, 4>)")
COPY = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<direct_copy_kernel_cuda>>(int)"
BN_FW = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>"
SPIN = "at::cuda::(anonymous namespace)::spin_kernel(long)"
TENSILE = "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_ISA90a"
NCCL_AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


# ---- expected-figure helpers (the schema of shared/traces/hta_anchor_values.json; times in µs) ----------------------

def temporal(rank, kernel_time, idle, compute, non_compute):
    return {"rank": rank, "idle_time(us)": idle, "compute_time(us)": compute, "non_compute_time(us)": non_compute,
            "kernel_time(us)": kernel_time}


def queue(count, mean, p50, mx):
    return {"count": count, "mean": mean, "p50": p50, "max": mx}


def launch_stats(n, mean_delay, short, cpu_gt_50, delay_gt_100):
    return {"n": n, "launch_delay_mean_us": mean_delay, "short_kernels(gpu<cpu)": short,
            "cpu_dur_gt_50us": cpu_gt_50, "launch_delay_gt_100us": delay_gt_100}


def split(span, compute, comm, overlapped, exposed, free, idle):
    return {"span_us": span, "compute_us": compute, "comm_us": comm, "overlapped_us": overlapped,
            "exposed_comm_us": exposed, "free_ascend_style_us": free, "idle_hta_style_us": idle}


def single_rank(tb, overlap_pct, idle_breakdown, queues, stats, derived, rank=0):
    return {"ranks": [rank], "temporal_breakdown": [tb], "comm_comp_overlap": [
        {"rank": rank, "comp_comm_overlap_pctg": overlap_pct}], "idle_time_breakdown_us": idle_breakdown,
        "queue_length": queues, "kernel_launch_stats": {str(rank): stats},
        "derived_split": {"rank%d" % rank: derived} if derived else {}}


def no_device(rank):
    """What HTA gives on a trace without device events: it stops (the test wants a "no device activity" row)."""
    return {"ranks": [rank], "temporal_breakdown": {"error": "no device events: HTA stops here"},
            "comm_comp_overlap": [{"rank": rank, "comp_comm_overlap_pctg": None}],
            "idle_time_breakdown_us": {"error": "no device events"}, "queue_length": None,
            "kernel_launch_stats": {str(rank): launch_stats(0, None, 0, 0, 0)}, "derived_split": {}}


# ---- the fixtures --------------------------------------------------------------------------------------------------

def sampled_2rank(out):
    """Two ranks of an NCCL job (distributedInfo with rank and world_size 128), integer µs, three streams: compute 7,
    NCCL 23, copies 25 (rank 0); two ProfilerSteps, so HTA's convention drops #552 and what was launched in it."""
    B, HOST = 1661203462598000, 10
    for rank in (0, 1):
        ev_ = [step(551, t(B, 0), 100, HOST, HOST, 1), step(552, t(B, 100), 50, HOST, HOST, 2)]
        if rank == 0:
            ev_ += [runtime("cudaLaunchKernel", t(B, 5), 5, 1, HOST, HOST), kernel(GEMM, t(B, 20), 30, 1, 7),
                    runtime("cudaLaunchKernel", t(B, 12), 4, 2, HOST, HOST), kernel(NCCL_AR, t(B, 40), 30, 2, 23),
                    runtime("cudaMemcpyAsync", t(B, 18), 4, 3, HOST, HOST),
                    kernel("Memcpy DtoD (Device -> Device)", t(B, 72), 3, 3, 25, cat="gpu_memcpy"),
                    runtime("cudaLaunchKernel", t(B, 60), 5, 4, HOST, HOST), kernel(ADD, t(B, 80), 10, 4, 7),
                    runtime("cudaLaunchKernel", t(B, 110), 5, 5, HOST, HOST), kernel(ADD, t(B, 120), 10, 5, 7)]
        else:
            # The first launch comes from a second host thread (11) and takes 60 µs: a short kernel, a launch call
            # over 50 µs, and a kernel that starts before its launch call returns (the delay is clipped to 0).
            ev_ += [runtime("cudaLaunchKernel", t(B, 2), 60, 1, HOST, 11), kernel(GEMM, t(B, 50), 10, 1, 7),
                    runtime("cudaLaunchKernel", t(B, 4), 3, 2, HOST, HOST), kernel(NCCL_AR, t(B, 10), 50, 2, 23),
                    runtime("cudaLaunchKernel", t(B, 7), 2, 3, HOST, HOST), kernel(ADD, t(B, 80), 10, 3, 7),
                    runtime("cudaLaunchKernel", t(B, 9), 2, 4, HOST, HOST), kernel(NCCL_AR, t(B, 125), 10, 4, 23),
                    runtime("cudaLaunchKernel", t(B, 105), 5, 5, HOST, HOST), kernel(ADD, t(B, 140), 10, 5, 7)]
        header = {"schemaVersion": 1, "record_shapes": 1,
                  "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 128}}
        write_trace(out, "sampled_2rank", "sampled_rank-%d.json.gz" % rank, header,
                    process_meta(HOST, "python", "CPU") + process_meta(0, "python", "GPU 0") + ev_)
    # HTA convention, offsets from B. Kept (launched before #552 at 100): rank 0 K1..M3, K4; rank 1 K1..K4.
    # rank 0: GEMM [20,50) s7, NCCL [40,70) s23, memcpy [72,75) s25, ADD [80,90) s7.
    #   busy = [20,70) + [72,75) + [80,90) = 50 + 3 + 10 = 63; kernel_time = 90 - 20 = 70; idle = 70 - 63 = 7;
    #   compute = [20,50) + [80,90) = 40; non-compute = 63 - 40 = 23 (NCCL 20 outside compute, memcpy 3).
    #   split over [20,90): C 40, M 30, overlapped [40,50) = 10, exposed 20, free 70 - |C u M| (60) = 10;
    #   overlap 10/30 = 33.33%.
    #   idle per stream: s7 ADD after GEMM: gap 30, its launch (60) after GEMM ended (50): host wait 30.
    #   queue s7: +1@5 -1@20 +1@60 -1@80 -> 1,0,1,0; s23: +1@12 -1@40; s25: +1@18 -1@72 -> 1,0.
    #   launches: delays 20-10=10, 40-16=24, 72-22=50, 80-65=15 -> mean 99/4 = 24.75; short: memcpy 3 < 4: 1.
    # rank 1: GEMM [50,60) s7, NCCL [10,60) s23, ADD [80,90) s7, NCCL [125,135) s23.
    #   busy = [10,60) + [80,90) + [125,135) = 70; kernel_time = 135 - 10 = 125; idle = 55; compute = 20;
    #   non-compute 50.
    #   split over [10,135): C 20, M 60, overlapped [50,60) = 10, exposed 50, free 125 - 70 = 55; 10/60 = 16.67%.
    #   idle: s7 ADD: gap 20, launched at 7 (before GEMM ended): under 30 µs: kernel wait 20;
    #         s23 second NCCL: gap 65, launched at 9: other 65.
    #   queue s7: +1@2 +1@7 -1@50 -1@80 -> 1,2,1,0: mean 1, median 1, max 2; s23: +1@4 +1@9 -1@10 -1@125: the same.
    #   launches: delays max(0, 50-62)=0, 10-7=3, 80-9=71, 125-11=114 -> mean 188/4 = 47; short: GEMM 10 < 60;
    #   launch call over 50 µs: 1 (60); delay over 100 µs: 1 (114).
    EXPECTED["sampled_2rank"] = {
        "ranks": [0, 1],
        "temporal_breakdown": [temporal(0, 70, 7, 40, 23), temporal(1, 125, 55, 20, 50)],
        "comm_comp_overlap": [{"rank": 0, "comp_comm_overlap_pctg": 33.33},
                              {"rank": 1, "comp_comm_overlap_pctg": 16.67}],
        "idle_time_breakdown_us": {"rank0/stream7/host_wait": 30, "rank0/stream7/kernel_wait": 0,
                                   "rank0/stream7/other": 0, "rank0/stream23/other": 0, "rank0/stream25/other": 0,
                                   "rank1/stream7/host_wait": 0, "rank1/stream7/kernel_wait": 20,
                                   "rank1/stream7/other": 0, "rank1/stream23/host_wait": 0,
                                   "rank1/stream23/kernel_wait": 0, "rank1/stream23/other": 65},
        "queue_length": {"rank0/stream7": queue(4, 0.5, 0.5, 1), "rank0/stream23": queue(2, 0.5, 0.5, 1),
                         "rank0/stream25": queue(2, 0.5, 0.5, 1), "rank1/stream7": queue(4, 1.0, 1.0, 2),
                         "rank1/stream23": queue(4, 1.0, 1.0, 2)},
        "kernel_launch_stats": {"0": launch_stats(4, 24.75, 1, 0, 0), "1": launch_stats(4, 47.0, 1, 1, 1)},
        "derived_split": {"rank0": split(70, 40, 30, 10, 20, 10, 7), "rank1": split(125, 20, 60, 10, 50, 55, 55)},
    }


def nccl_2rank_rank0(out):
    """Rank 0 of a 2-rank DDP job: float µs with ns digits, baseTimeNanoseconds, NCCL kernels carrying the collective's
    args (Collective name, message sizes, process group), record_param_comms / nccl:all_reduce on the host, three
    ProfilerSteps #4..#6; host-bound (the device idles most of each step)."""
    B, HOST, NCCL_THREAD = Decimal("4458676400000"), 2910249, 2919752
    coll = {"Collective name": "allreduce", "In msg nelems": 2049000, "Out msg nelems": 2049000, "Group size": 2,
            "dtype": "Float", "In split size": "[]", "Out split size": "[]", "Process Group Name": "0",
            "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]"}
    e = []
    for i, (n, s) in enumerate(((4, "0.125"), (5, "100.125"), (6, "200.125"))):
        e.append(step(n, t(B, s), "99.750", HOST, HOST, 1 + 1000 * i))
    rows = [  # (launch name, launch ts, launch dur, corr, device name, device cat, stream, device ts, device dur)
        ("cudaLaunchKernel", "2.125", "4.250", 101, BN_FW, "kernel", 7, "10.250", "30.500"),
        ("cudaLaunchKernel", "8.375", "3.250", 102, NCCL_AR, "kernel", 40, "30.625", "20.250"),
        ("cudaMemcpyAsync", "60.375", "9.250", 103, "Memcpy DtoD (Device -> Device)", "gpu_memcpy", 7, "70.125",
         "5.500"),
        ("cudaLaunchKernel", "102.125", "4.250", 201, GEMM, "kernel", 7, "110.250", "30.500"),
        ("cudaLaunchKernel", "108.375", "3.250", 202, NCCL_AR, "kernel", 40, "145.625", "20.250"),
        ("cudaLaunchKernel", "202.125", "4.250", 301, GEMM, "kernel", 7, "210.250", "30.500"),
        ("cudaLaunchKernel", "208.375", "3.250", 302, NCCL_AR, "kernel", 40, "230.625", "20.250"),
    ]
    for name, lts, ldur, corr, dname, dcat, stream, dts, ddur in rows:
        e.append(runtime(name, t(B, lts), ldur, corr, HOST, HOST))
        extra = dict(coll) if stream == 40 else {}
        e.append(kernel(dname, t(B, dts), ddur, corr, stream, cat=dcat, **extra))
        if stream == 40:  # the host side of the collective, on PyTorch's NCCL thread
            e.append(cpu_op("record_param_comms", t(B, lts) - Decimal("1.5"), "5.125", HOST, NCCL_THREAD, corr))
            e[-1]["args"].update(coll)
            e.append(cpu_op("nccl:all_reduce", t(B, lts) - Decimal("1.25"), "4.500", HOST, NCCL_THREAD, corr,
                            "user_annotation"))
        e += flow(corr, t(B, lts), t(B, dts), HOST, HOST, stream)
    header = {"schemaVersion": 1, "deviceProperties": A100,
              "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2, "pg_count": 1,
                                  "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                                 "pg_size": 2, "ranks": [0, 1]}], "nccl_version": "2.17.1"},
              "traceName": "/tmp/tmp_synthetic.json", "displayTimeUnit": "ms",
              "baseTimeNanoseconds": 1711964646000000000}
    write_trace(out, "nccl_2rank_rank0", "nccl_data.json.gz", header,
                process_meta(HOST, "python", "CPU") + process_meta(0, "python", "GPU 0") +
                profiler_span(t(B, 0), "300.000") + e)
    # HTA convention, offsets from B; each bound trimmed inward: [ceil(ts), floor(ts + dur)).
    # Steps #4 [1,99), #5 [101,199), #6 [201,299): launches at or after 201 (the two of #6) are dropped with their
    # kernels. Kept: bn_fw [10.25,40.75) -> [11,40) s7; NCCL [30.625,50.875) -> [31,50) s40;
    #       memcpy [70.125,75.625) -> [71,75) s7;
    #       GEMM [110.25,140.75) -> [111,140) s7; NCCL [145.625,165.875) -> [146,165) s40.
    #   busy = [11,50) 39 + [71,75) 4 + [111,140) 29 + [146,165) 19 = 91; kernel_time = 165 - 11 = 154; idle = 63;
    #   compute = 29 + 29 = 58; non-compute = 91 - 58 = 33.
    #   split over [11,165): C 58, M 19 + 19 = 38, overlapped [31,40) = 9, exposed 29,
    #   free = 154 - |C u M| (39 + 29 + 19 = 87) = 67; overlap 9/38 = 23.68%.
    #   idle s7: memcpy gap 71-40 = 31, launched at ceil(60.375) = 61 > 40: host wait; GEMM gap 111-75 = 36, launched
    #   at 103 > 75: host wait -> 67. s40: gap 146-50 = 96, launched at 109 > 50: host wait 96.
    #   queue s7: +1@3 -1@11 +1@61 -1@71 +1@103 -1@111 -> 1,0,1,0,1,0; s40: +1@9 -1@31 +1@109 -1@146.
    #   launches (calls trimmed the same way): [3,6) -> 11: 5; [9,11) -> 31: 20; [61,69) -> 71: 2; [103,106) -> 111: 5;
    #   [109,111) -> 146: 35; mean 67/5 = 13.4; short: the memcpy (4 < 8).
    EXPECTED["nccl_2rank_rank0"] = single_rank(
        temporal(0, 154, 63, 58, 33), 23.68,
        {"rank0/stream7/host_wait": 67, "rank0/stream7/kernel_wait": 0, "rank0/stream7/other": 0,
         "rank0/stream40/host_wait": 96, "rank0/stream40/other": 0},
        {"rank0/stream7": queue(6, 0.5, 0.5, 1), "rank0/stream40": queue(4, 0.5, 0.5, 1)},
        launch_stats(5, 13.4, 1, 0, 0), split(154, 58, 38, 9, 29, 67, 63))


def alexnet_single(out):
    """One rank, no ProfilerStep, cuda_sync records on device streams: "Stream Sync" on stream 7 and "Context Sync"
    on stream 4294967295 (CUPTI's uint32 -1); blocking copies (launch calls that end after their copy started)."""
    B, HOST = 1695835572943000, 2869224
    rows = [  # (launch name, ts, dur, corr, device name, cat, stream, device ts, device dur)
        ("cudaMemcpyAsync", 0, 40, 1, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 7, 10, 28),
        ("cudaStreamSynchronize", 40, 10, 2, "Stream Sync", "cuda_sync", 7, 41, 8),
        ("cudaLaunchKernel", 55, 5, 3, FILL, "kernel", 7, 62, 10),
        ("cudaLaunchKernel", 61, 4, 4, GEMM, "kernel", 7, 75, 30),
        ("cudaMemcpyAsync", 66, 52, 5, "Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 20, 106, 4),
        ("cudaDeviceSynchronize", 118, 6, 6, "Context Sync", "cuda_sync", 4294967295, 119, 5),
        ("cudaLaunchKernel", 124, 2, 7, ADD, "kernel", 7, 130, 10),
    ]
    e = []
    for name, lts, ldur, corr, dname, dcat, stream, dts, ddur in rows:
        e.append(runtime(name, t(B, lts), ldur, corr, HOST, HOST))
        extra = {"cuda_sync_kind": dname} if dcat == "cuda_sync" else {}
        d = kernel(dname, t(B, dts), ddur, corr, stream, cat=dcat, **extra)
        if stream == 4294967295:
            d["tid"] = -1
        e.append(d)
    header = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "deviceProperties": A100,
              "traceName": "benchmark_result_synthetic_trace.json"}
    write_trace(out, "alexnet_single", "benchmark_result_synthetic_trace.json.gz", header,
                process_meta(HOST, "python", "CPU") + process_meta(0, "python", "GPU 0") + e)
    # No ProfilerStep: nothing dropped. Device: memcpy [10,38) s7, Stream Sync [41,49) s7, FILL [62,72) s7,
    # GEMM [75,105) s7, memcpy [106,110) s20, Context Sync [119,124) s4294967295, ADD [130,140) s7.
    #   busy = 28 + 8 + 10 + 30 + 4 + 5 + 10 = 95 (no two overlap); kernel_time = 140 - 10 = 130; idle = 35;
    #   compute = 10 + 30 + 10 = 50; non-compute = 45: copies 32 and the two syncs 13 (busy, but not compute).
    #   split over [10,140): C 50, M 0, free 130 - 50 = 80 (copies and syncs are Free there); no communication.
    #   idle s7 (syncs left out): FILL gap 62-38 = 24, launched at 55 > 38: host wait; GEMM gap 3, launched at 61 < 72:
    #   kernel wait 3; ADD gap 130-105 = 25, launched at 124 > 105: host wait -> host wait 49.
    #   queue (launches and async copies; syncs are not queued) s7: +1@0 -1@10 +1@55 +1@61 -1@62 -1@75 +1@124 -1@130
    #   -> 1,0,1,2,1,0,1,0: mean 6/8 = 0.75, median 1, max 2; s20: +1@66 -1@106.
    #   launches (cudaLaunchKernel, cudaMemcpyAsync): delays max(0,10-40)=0, 62-60=2, 75-65=10, max(0,106-118)=0,
    #   130-126=4 -> mean 16/5 = 3.2; short: both copies (28 < 40, 4 < 52); call over 50 µs: the 52 µs copy.
    EXPECTED["alexnet_single"] = single_rank(
        temporal(0, 130, 35, 50, 45), None,
        {"rank0/stream7/host_wait": 49, "rank0/stream7/kernel_wait": 3, "rank0/stream7/other": 0,
         "rank0/stream20/host_wait": 0, "rank0/stream20/other": 0, "rank0/stream4294967295/other": 0},
        {"rank0/stream7": queue(8, 0.75, 1.0, 2), "rank0/stream20": queue(2, 0.5, 0.5, 1)},
        launch_stats(5, 3.2, 2, 1, 0), split(130, 50, 0, 0, 0, 80, 35))


def event_sync(out):
    """Tiny: one ProfilerStep; cudaEventRecord after a kernel on stream 7, cudaStreamWaitEvent making stream 20 wait
    for it (a "Stream Wait Event" cuda_sync record on stream 20), cudaEventSynchronize and cudaDeviceSynchronize
    (records on stream -1: not device events), a blocking copy and its "Stream Sync"."""
    B, HOST = 1707417525509000, 948300
    e = [step(100, t(B, 0), 200, HOST, HOST, 1)]
    rows = [  # (launch name, ts, dur, corr, device name, cat, stream, device ts, device dur, extra args)
        ("cudaLaunchKernel", 10, 30, 11, FILL, "kernel", 7, 45, 1, {}),
        ("cudaLaunchKernel", 42, 10, 12, SPIN, "kernel", 7, 55, 36, {}),
        ("cudaEventRecord", 53, 3, 13, None, None, None, None, None, None),
        ("cudaStreamWaitEvent", 57, 2, 14, "Stream Wait Event", "cuda_sync", 20, 59, 32,
         {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 13,
          "wait_on_cuda_event_id": 8}),
        ("cudaLaunchKernel", 60, 5, 15, REDUCE, "kernel", 20, 91, 10, {}),
        ("cudaEventSynchronize", 66, 36, 16, "Event Sync", "cuda_sync", -1, 67, 34,
         {"cuda_sync_kind": "Event Sync", "wait_on_stream": 20, "wait_on_cuda_event_record_corr_id": 13}),
        ("cudaMemcpyAsync", 105, 12, 17, "Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 7, 110, 2, {}),
        ("cudaStreamSynchronize", 117, 4, 18, "Stream Sync", "cuda_sync", 7, 118, 3, {"cuda_sync_kind": "Stream Sync"}),
        ("cudaDeviceSynchronize", 130, 8, 19, "Context Sync", "cuda_sync", -1, 131, 6,
         {"cuda_sync_kind": "Context Sync"}),
    ]
    for name, lts, ldur, corr, dname, dcat, stream, dts, ddur, extra in rows:
        e.append(runtime(name, t(B, lts), ldur, corr, HOST, HOST))
        if dname:
            e.append(kernel(dname, t(B, dts), ddur, corr, stream, cat=dcat, **extra))
    header = {"schemaVersion": 1, "deviceProperties": A100, "distributedInfo": {"rank": 0},
              "traceName": "event_sync_trace.json"}
    write_trace(out, "event_sync", "event_sync_trace.json.gz", header,
                process_meta(HOST, "python", "CPU") + process_meta(0, "python", "GPU 0") +
                profiler_span(t(B, 0), 200) + e)
    # One ProfilerStep: nothing dropped. Device events (stream != -1): FILL [45,46) s7, spin [55,91) s7,
    # Stream Wait Event [59,91) s20, REDUCE [91,101) s20, memcpy [110,112) s7, Stream Sync [118,121) s7.
    #   busy = [45,46) 1 + [55,101) 46 + [110,112) 2 + [118,121) 3 = 52; kernel_time = 121 - 45 = 76; idle = 24;
    #   compute = 1 + 36 + 10 = 47; non-compute = 52 - 47 = 5 (copy 2, Stream Sync 3; the wait lies under spin).
    #   split over [45,121): C 47, M 0, free 76 - 47 = 29.
    #   idle s7 (syncs left out): spin gap 55-46 = 9, launched at 42 < 46: kernel wait 9; memcpy gap 110-91 = 19,
    #   launched at 105 > 91: host wait 19. s20: REDUCE alone once the wait record is left out: nothing.
    #   queue s7: +1@10 +1@42 -1@45 -1@55 +1@105 -1@110 -> 1,2,1,0,1,0: mean 5/6, median 1, max 2; s20: +1@60 -1@91.
    #   launches: delays 45-40=5, 55-52=3, 91-65=26, max(0,110-117)=0 -> mean 34/4 = 8.5;
    #   short: FILL (1 < 30), copy (2 < 12).
    EXPECTED["event_sync"] = single_rank(
        temporal(0, 76, 24, 47, 5), None,
        {"rank0/stream7/host_wait": 19, "rank0/stream7/kernel_wait": 9, "rank0/stream7/other": 0,
         "rank0/stream20/host_wait": 0, "rank0/stream20/other": 0},
        {"rank0/stream7": queue(6, 5 / 6, 1.0, 2), "rank0/stream20": queue(2, 0.5, 0.5, 1)},
        launch_stats(4, 8.5, 2, 0, 0), split(76, 47, 0, 0, 0, 29, 24))


def ns_resolution(out):
    """displayTimeUnit "ns" while ts stays in µs (with ns digits): the kernels span ~385 ms, not ~385 µs. The launch
    queue is saturated (five launches queued before the first kernel starts): device-bound, not host-bound."""
    B, HOST = Decimal("1712195495000000"), 1102
    e = [step(101, t(B, "0.250"), "190000.000", HOST, HOST, 1),
         step(102, t(B, "190000.250"), "200000.000", HOST, HOST, 2)]
    rows = [  # (launch name, ts, corr, device name, cat, device ts, device dur); every launch call lasts 5.5 µs
        ("cudaLaunchKernel", "10.250", 1, GEMM, "kernel", "100.250", "60000.000"),
        ("cudaLaunchKernel", "20.250", 2, GEMM, "kernel", "60100.250", "90000.000"),
        ("cudaMemcpyAsync", "30.250", 3, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "150102.500", "1500.250"),
        ("cudaLaunchKernel", "40.250", 4, GEMM, "kernel", "151610.250", "100000.000"),
        ("cudaLaunchKernel", "50.250", 5, ADD, "kernel", "251610.250", "133000.500"),
        ("cudaLaunchKernel", "190010.250", 6, ADD, "kernel", "384612.250", "5000.500"),
    ]
    for name, lts, corr, dname, dcat, dts, ddur in rows:
        e.append(runtime(name, t(B, lts), "5.500", corr, HOST, HOST))
        e.append(kernel(dname, t(B, dts), ddur, corr, 7, cat=dcat))
    header = {"schemaVersion": 1, "deviceProperties": A100,
              "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
              "traceName": "/tmp/libkineto_activities_1102.json", "displayTimeUnit": "ns"}
    write_trace(out, "ns_resolution", "rank-0.synthetic.pt.trace.json.gz", header,
                process_meta(HOST, "python", "CPU") + process_meta(0, "python", "GPU 0") +
                profiler_span(t(B, 0), "390000.500") + e)
    # Exact: busy from 100.25 to 389612.75 µs: kernel_time 389512.5 µs (ns digits kept, 300-500 ms).
    # HTA convention, offsets from B: steps #101 [1,190000), #102 [190001,390000): the last launch (ts 190011 after
    # trimming) and its kernel are dropped. Kept, trimmed: GEMM [101,60100), GEMM [60101,150100),
    # memcpy [150103,151602), GEMM [151611,251610), ADD [251611,384610), all on stream 7.
    #   lengths 59999 + 89999 + 1499 + 99999 + 132999 = 384495 busy; kernel_time = 384610 - 101 = 384509;
    #   idle = 14 (gaps 1 + 3 + 9 + 1); compute = 384495 - 1499 = 382996; non-compute = 1499.
    #   split over [101,384610): C 382996, M 0, free = 384509 - 382996 = 1513.
    #   idle s7: every gap (1, 3, 9, 1) follows a launch made long before, and is under 30 µs: kernel wait 14.
    #   queue s7: +1@11 +1@21 +1@31 +1@41 +1@51, then -1 at each start -> 1,2,3,4,5,4,3,2,1,0: mean 2.5,
    #   median 2.5, max 5.
    #   launches (calls [11,15), [21,25), ...): delays 101-15=86, 60101-25=60076, 150103-35=150068, 151611-45=151566,
    #   251611-55=251556 -> mean 613352/5 = 122670.4; four over 100 µs; none short (every call lasts 4 µs once
    #   trimmed).
    EXPECTED["ns_resolution"] = single_rank(
        temporal(0, 384509, 14, 382996, 1499), None,
        {"rank0/stream7/host_wait": 0, "rank0/stream7/kernel_wait": 14, "rank0/stream7/other": 0},
        {"rank0/stream7": queue(10, 2.5, 2.5, 5)},
        launch_stats(5, 122670.4, 0, 0, 4), split(384509, 382996, 0, 0, 0, 1513, 14))


def amd_mi250(out):
    """ROCm: device events on stream 0 (pid 2, tid 0), hip* runtime calls whose "stream" is the string "0x0", no
    distributedInfo (and no rank in the file name); a ProfilerStep also recorded on the device (gpu_user_annotation)."""
    B, HOST, GPU = Decimal("4203669600000"), 597913, 2
    e = [step(1, t(B, "0.125"), "500.250", HOST, HOST, 1), step(2, t(B, "500.625"), "100.250", HOST, HOST, 39),
         ev("gpu_user_annotation", "ProfilerStep#1", GPU, 0, t(B, "20.125"), "300.000", {"External id": 1})]
    rows = [  # (hip call, ts, dur, corr, device name, cat, device ts, device dur)
        ("hipMemcpyWithStream", "10.125", "60.250", 117, "Memcpy HtoD (Host -> Device)", "gpu_memcpy", "20.125",
         "22.500"),
        ("hipLaunchKernel", "80.375", "11.500", 118, COPY, "kernel", "95.625", "4.250"),
        ("hipGetDevicePropertiesR0600", "93.125", "0.875", 119, None, None, None, None),
        ("hipExtModuleLaunchKernel", "100.125", "5.250", 120, TENSILE, "kernel", "106.875", "40.250"),
        ("hipLaunchKernel", "520.125", "5.000", 121, FILL, "kernel", "530.125", "10.000"),
    ]
    for name, lts, ldur, corr, dname, dcat, dts, ddur in rows:
        call = ev("cuda_runtime", name, HOST, HOST, t(B, lts), ldur,
                  {"External id": corr, "cid": 107, "correlation": corr})
        if dname:
            call["args"]["stream"] = "0x0"  # ROCm writes the host side's stream as a string: not a device event
            d = kernel(dname, t(B, dts), ddur, corr, 0, cat=dcat, device=GPU)
            d["args"].pop("context")
            e += [call, d]
        else:
            e.append(call)
    header = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI250X/MI250",
                                                        "totalGlobalMem": 68702699520, "computeMajor": 9,
                                                        "computeMinor": 0}],
              "record_shapes": 1, "traceName": "./logs/mi250_synthetic_kineto.json", "displayTimeUnit": "ms",
              "baseTimeNanoseconds": 1735632360000000000}
    write_trace(out, "amd_mi250", "mi250_synthetic_ROCm6_2_kineto.json.gz", header,
                process_meta(HOST, "python3", "CPU") + process_meta(GPU, "python3", "GPU 2") + e)
    # HTA convention, offsets from B: steps #1 [1,500) (and on the device [21,320)), #2 [501,600): the launch at
    # ceil(520.125) = 521 and its kernel are dropped. Kept: memcpy [20.125,42.625) -> [21,42), copy kernel
    # [95.625,99.875) -> [96,99), GEMM [106.875,147.125) -> [107,147), all on stream 0.
    #   busy = 21 + 3 + 40 = 64; kernel_time = 147 - 21 = 126; idle = 62; compute = 43; non-compute = 21 (the copy).
    #   split over [21,147): C 43, M 0, free 126 - 43 = 83.
    #   idle s0: copy kernel gap 96-42 = 54, launched at 81 > 42: host wait; GEMM gap 107-99 = 8, launched at 101 > 99:
    #   host wait -> 62.
    #   queue s0 (hip launches count): +1@11 -1@21 +1@81 -1@96 +1@101 -1@107 -> 1,0,1,0,1,0.
    #   launch statistics count CUDA's calls only (cudaLaunchKernel, cudaMemcpyAsync, ...): none here.
    EXPECTED["amd_mi250"] = single_rank(
        temporal(0, 126, 62, 43, 21), None,
        {"rank0/stream0/host_wait": 62, "rank0/stream0/other": 0},
        {"rank0/stream0": queue(6, 0.5, 0.5, 1)},
        launch_stats(0, None, 0, 0, 0), split(126, 43, 0, 0, 0, 83, 62))


def cpu_only(out):
    """A CPU-only Kineto trace (rank 34 of 300, gloo): an empty deviceProperties list, cpu_op operators on the main
    thread, gloo:all_reduce (user_annotation) on two gloo worker threads, one ProfilerStep; fractional µs."""
    B, PID, MAIN, W1, W2 = Decimal("1212075520000"), 1074, 1074, 3553, 3554
    e = [{"name": "thread_name", "ph": "M", "ts": t(B, 0), "pid": PID, "tid": tid,
          "args": {"name": "thread %d (pt_main_thread)" % tid}} for tid in (MAIN, W1, W2)]
    e += [step(551, t(B, "100.125"), "1000.000", PID, MAIN, 1),
          cpu_op("aten::linear", t(B, "150.125"), "200.000", PID, MAIN, 2),
          cpu_op("aten::mm", t(B, "160.125"), "180.000", PID, MAIN, 3),
          cpu_op("c10d::allreduce_", t(B, "360.125"), "20.000", PID, MAIN, 4),
          cpu_op("gloo:all_reduce", t(B, "400.250"), "300.000", PID, W1, 5, "user_annotation"),
          cpu_op("gloo:all_reduce", t(B, "450.250"), "350.000", PID, W2, 6, "user_annotation"),
          cpu_op("aten::add", t(B, "820.500"), "80.000", PID, MAIN, 7),
          cpu_op("aten::empty", t(B, "1200.125"), "1.000", PID, MAIN, 8)]
    header = {"schemaVersion": 1, "deviceProperties": [],
              "distributedInfo": {"backend": "gloo", "rank": 34, "world_size": 300},
              "traceName": "/tmp/libkineto_activities_1074.json", "displayTimeUnit": "ms",
              "baseTimeNanoseconds": 1719853884000000000}
    write_trace(out, "cpu_only", "rank-34.synthetic.1074.pt.trace.json.gz", header,
                process_meta(PID, "trainer", "CPU") + profiler_span(t(B, 0), "1300.000") + e)
    # No device events: HTA stops; coc says "no device activity" under its convention. Under the exact convention
    # (torch-cpu), the step [100.125,1100.125) = 1000 µs: computing = aten::linear (holding aten::mm) 200 + aten::add
    # 80 = 280; communication = c10d::allreduce_ 20 + gloo [400.25,800.25) 400 = 420; overlapped 0; free 300.
    EXPECTED["cpu_only"] = no_device(34)


def cpu_ops_of_step_1009(pid):
    """The host-only body shared by the three rank fixtures below: one ProfilerStep of CPU operators."""
    B = 1661203462598000
    return [step(1009, t(B, 772), 75473, pid, pid, 5), cpu_op("aten::zeros", t(B, 738), 19, pid, pid, 1),
            cpu_op("aten::empty", t(B, 743), 3, pid, pid, 2), cpu_op("aten::linear", t(B, 800), 30000, pid, pid, 6),
            cpu_op("aten::addmm", t(B, 810), 29000, pid, pid, 7), cpu_op("aten::relu", t(B, 40000), 5000, pid, pid, 8)]


def rank_fixtures(out):
    """Three host-only traces of one ProfilerStep, differing in the header: distributedInfo without a rank;
    no distributedInfo (deviceProperties listing a GPU, yet no device events); a rank, no GPU, no schemaVersion."""
    pid = 3113936
    body = process_meta(pid, "python", "CPU") + cpu_ops_of_step_1009(pid)
    write_trace(out, "rank_unavailable", "rank_not_found.json.gz", {"distributedInfo": {"backend": "nccl"}}, body)
    write_trace(out, "distributed_info_unavailable", "distributed_info_not_found.json.gz",
                {"schemaVersion": 1, "deviceProperties": A100}, body)
    write_trace(out, "rank_non_gpu", "rank_non_gpu.json.gz", {"distributedInfo": {"rank": 0}}, body)
    # No device events anywhere: HTA stops on each (HTA numbers rank-less files 0).
    for name in ("rank_unavailable", "distributed_info_unavailable", "rank_non_gpu"):
        EXPECTED[name] = no_device(0)


def legacy_2021(out):
    """The 2021 Kineto format: capitalised categories (Operator, Runtime, Kernel, Memcpy, Memset), string tids
    ("25738", "stream 7"), lowercase "external id", async flow events; no distributedInfo (the rank, 0, is in the file
    name "worker0"); six ProfilerSteps #5..#10."""
    B, PID = 1623142623460000, 25738
    e = []
    corr = 34400
    for i in range(6):
        s = 1000 * i
        e.append({"ph": "X", "cat": "Operator", "name": "ProfilerStep#%d" % (5 + i), "pid": PID, "tid": str(PID),
                  "ts": t(B, s + 10), "dur": 900, "args": {"Device": PID, "External id": 4 + 100 * i,
                                                            "Trace name": "PyTorch Profiler", "Trace iteration": 0}})
        work = [("cudaLaunchKernel", GEMM, "Kernel", 300)]
        if i == 0:
            work.append(("cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)", "Memcpy", 20))
        if i == 1:
            work.append(("cudaMemsetAsync", "Memset (Device)", "Memset", 2))
        for j, (call, dname, dcat, ddur) in enumerate(work):
            corr += 1
            ext = 537 + 100 * i + j
            lts, dts = s + 100 + 400 * j, s + 120 + 400 * j
            e.append({"ph": "X", "cat": "Operator", "name": "aten::conv2d" if j == 0 else "aten::copy_", "pid": PID,
                      "tid": str(PID), "ts": t(B, lts - 5), "dur": 40, "args": {"External id": ext}})
            e.append({"ph": "X", "cat": "Runtime", "name": call, "pid": PID, "tid": str(PID), "ts": t(B, lts),
                      "dur": 15, "args": {"cbid": CBID[call], "correlation": corr, "external id": ext,
                                          "external ts": t(B, lts - 5)}})
            e.append({"ph": "X", "cat": dcat, "name": dname, "pid": 0, "tid": "stream 7", "ts": t(B, dts),
                      "dur": ddur, "args": {"device": 0, "context": 1, "stream": 7, "correlation": corr,
                                            "external id": ext}})
            e.append({"ph": "s", "id": corr, "pid": PID, "tid": str(PID), "ts": t(B, lts), "cat": "async",
                      "name": "launch"})
            e.append({"ph": "f", "id": corr, "pid": 0, "tid": "stream 7", "ts": t(B, dts), "cat": "async",
                      "name": "launch", "bp": "e"})
    header = {"schemaVersion": 1, "deviceProperties": A100}
    write_trace(out, "legacy_2021", "worker0.synthetic.pt.trace.json.gz", header,
                process_meta(PID, "python", "CPU") + process_meta(0, "python", "GPU 0") + e)
    # Checked by TraceEdgeCases (exact convention): 6 steps, 8 launches matched to their device events by correlation
    # (6 kernels, 1 copy, 1 memset), stream 7 from "stream 7", memory and compute kinds both present.


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for make in (sampled_2rank, nccl_2rank_rank0, alexnet_single, event_sync, ns_resolution, amd_mi250, cpu_only,
                 rank_fixtures, legacy_2021):
        make(out)
    doc = {"_about": "Expected figures of coc's synthetic fixtures in kineto/, worked out by hand under HTA's "
                     "conventions (derivations: make_kineto_fixtures.py, beside this file). Same schema as "
                     "shared/traces/hta_anchor_values.json; times in µs. Not HTA's output: HTA never saw these files.",
           "traces": EXPECTED}
    with open(os.path.join(out, "kineto_expected.json"), "w") as f:
        f.write(dumps_pretty(doc) + "\n")


def dumps_pretty(v, indent=0):
    """Readable JSON for the expected figures: one trace, one key per line."""
    pad = "  " * indent
    if isinstance(v, dict) and v and indent < 3:
        items = ['%s  "%s": %s' % (pad, k, dumps_pretty(x, indent + 1)) for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return dumps(v)


if __name__ == "__main__":
    main()
