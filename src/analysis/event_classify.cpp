#include "event_classify.h"

#include "coc/analysis/trace_writer.h"

namespace coc::analysis::detail {

namespace {
bool has(const std::string& s, const char* p) { return s.find(p) != std::string::npos; }

bool is_sync(const std::string& name, const std::string& cat) {
  return cat == "cuda_sync" || name == "Stream Sync" || name == "Event Sync" || name == "Context Sync" ||
         name == "Device Synchronize" || name == "Stream Wait Event";
}

bool is_comm(const std::string& name, Convention conv) {
  if (has(name, "ncclKernel")) return true;
  if (conv == Convention::kHta) return false;
  return has(name, "ncclDevKernel") || has(name, "rccl") || has(name, "hcom_") || has(name, "hccl") ||
         has(name, "HCCL");
}
}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kCompute: return "compute";
    case Kind::kComm: return "communication";
    case Kind::kMemory: return "memory";
    case Kind::kSync: return "sync";
    case Kind::kOther: return "other";
  }
  return "other";
}

Kind classify_device_event(const std::string& name, const std::string& cat, Convention conv) {
  if (is_sync(name, cat)) return Kind::kSync;
  if (is_comm(name, conv)) return Kind::kComm;
  if (has(name, "Memcpy") || has(name, "Memset")) return Kind::kMemory;
  if (conv != Convention::kHta &&
      (cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "Memcpy" || cat == "Memset"))
    return Kind::kMemory;
  return Kind::kCompute;
}

Kind classify_ascend_task(const std::string& name, const std::string& task_type) {
  if (has(task_type, "MEMCPY") || has(task_type, "MEMSET") || has(name, "Memcpy") || has(name, "MEMCPY"))
    return Kind::kMemory;
  if (has(task_type, "HCCL") || has(task_type, "COMMUNICATION") || has(name, "hcom_") || has(name, "hccl"))
    return Kind::kComm;
  if (has(task_type, "EVENT") || has(task_type, "NOTIFY") || has(name, "Sync")) return Kind::kSync;
  return Kind::kCompute;
}

Kind classify_cpu_op(const std::string& name, const std::string& cat) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("gloo:") || starts("c10d::") || starts("c10d:") || starts("nccl:") || starts("mpi:") ||
      starts("record_param_comms"))
    return Kind::kComm;
  if (starts("ProfilerStep") || cat == "Trace" || cat == "python_function" || cat == "cpu_instant_event" ||
      cat == "user_annotation")
    return Kind::kOther;
  return Kind::kCompute;
}

bool is_pp_recv_wait(std::string_view name) { return name == kPpRecvWaitEvent; }

std::string_view comm_group_row(std::string_view group, std::string_view name) {
  if (group.starts_with(kPpLinkPrefix) || is_pp_recv_wait(name)) return kPpGroup;
  return group;
}

}  // namespace coc::analysis::detail
