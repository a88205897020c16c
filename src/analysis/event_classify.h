// What a device event counts as in the overlap analysis (internal to src/analysis/).
//
// Rules, in order (edge cases 20 and 30 of docs/edge-cases.md):
//  1. sync: category "cuda_sync", or the names Kineto gives synchronisation records ("Stream Sync",
//     "Event Sync", "Context Sync", "Device Synchronize", "Stream Wait Event"). Neither compute nor
//     communication: HTA counted them as compute until mid-2024, which inflated the overlap.
//  2. communication: HTA (hta/utils/utils.py is_comm_kernel) matches "ncclKernel" in the name; under
//     Convention::kHta that is the whole rule. Otherwise we also match "ncclDevKernel" (NCCL ≥ 2.19),
//     "rccl", and Ascend's HCCL ops ("hcom_", "hccl", "HCCL").
//  3. memory: "Memcpy" or "Memset" in the name (HTA is_memory_kernel), or the categories gpu_memcpy /
//     gpu_memset and the legacy capitalised Memcpy / Memset; Ascend tasks of type MEMCPY_ASYNC.
//  4. compute: everything else that ran on a device.
#pragma once

#include <string>
#include <string_view>

#include "coc/analysis/analyze.h"
#include "trace_model.h"

namespace coc::analysis::detail {

Kind classify_device_event(const std::string& name, const std::string& cat, Convention conv);

/// Ascend (torch_npu trace_view.json): `task_type` is args["Task Type"] ("AI_CORE", "MEMCPY_ASYNC", ...).
Kind classify_ascend_task(const std::string& name, const std::string& task_type);

/// A PyTorch CPU-only trace's host event (trace_reader_torch_cpu.cpp; docs/analysis.md, "PyTorch CPU traces"):
///  - kComm: a collective, on whichever thread runs it: names starting "gloo:", "c10d::", "nccl:", "mpi:", or
///    "record_param_comms" (PyTorch >= 2.0's wrapper of every c10d call);
///  - kOther: not an operator: ProfilerStep#N (a step), the profiler's own span (cat "Trace"), Python frames
///    (cat "python_function"), instant events, and user annotations (cat "user_annotation", e.g. record_function
///    ranges, whose operators are counted themselves);
///  - kCompute: every other operator (aten::*, autograd nodes, optimizer ops, ...).
/// `cat` is empty in PyTorch 1.13's bare-array files, which have no categories.
Kind classify_cpu_op(const std::string& name, const std::string& cat);

/// The communicator row ("communication by communicator") a communication event counts under: its communicator
/// `group` as the trace names it ("" when none), except coc's pipeline transfers (analysis/trace_writer.h): the
/// stage links "pp-link-act" / "pp-link-grad" and the wait "pp_recv_wait" (`name`; traces written before the writer
/// named its communicator carry none) count as "pp", with the pp group's own collectives. "" means no row. The
/// result views `group` or a static string.
std::string_view comm_group_row(std::string_view group, std::string_view name);

/// The operation of a coc communication event (docs/analysis.md, "Exposed communication per operation"), from its
/// args.tag as the layers write it ("layers.1.mlp.down fwd chunk 16/16 [256, 512] recv"): the layer index is folded
/// ("layers.<i>." → "layers.*.", so every layer's same op adds up), the chunk and segment counters (" chunk i/N" with
/// the chunk's shape "[rows, cols]" after it, " segment i/N") and trailing " send" / " recv" qualifiers and hop
/// numbers (ring attention's " inner 3") are dropped: "layers.*.mlp.down fwd". Words that name a phase
/// (" scatter", " gather", " dX") stay. "" for an empty tag.
std::string comm_op_name(std::string_view tag);

/// The collective of a coc communication event's name (the communicator op, comm/communicator.cpp op_name): the
/// element type (".bf16") and the halves of an exchange or the payload kind ("_recvs", "_sends", "_bytes") are
/// dropped, so that an op's receives and sends add up: "exchange_recvs" → "exchange", "all_gather.bf16" →
/// "all_gather". A reduction other than the sum stays ("all_reduce_max").
std::string_view comm_collective(std::string_view name);

/// True for coc's "pp_recv_wait" events: a pipeline stage waiting for a neighbour's message (the bubble's events).
bool is_pp_recv_wait(std::string_view name);

}  // namespace coc::analysis::detail
