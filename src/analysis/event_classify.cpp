#include "event_classify.h"

#include <algorithm>
#include <vector>

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

namespace {
bool is_counter(std::string_view w) {  // "3/16"
  const size_t slash = w.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == w.size()) return false;
  for (size_t i = 0; i < w.size(); ++i)
    if (i != slash && (w[i] < '0' || w[i] > '9')) return false;
  return true;
}
bool is_number(std::string_view w) {
  return !w.empty() && w.find_first_not_of("0123456789") == std::string_view::npos;
}
}  // namespace

std::string comm_op_name(std::string_view tag) {
  // Words, so that a counter is recognised only as a whole word and its shape "[256, 512]" (two words) after it.
  std::vector<std::string_view> words;
  for (size_t b = 0; b < tag.size();) {
    const size_t e = std::min(tag.find(' ', b), tag.size());
    if (e > b) words.push_back(tag.substr(b, e - b));
    b = e + 1;
  }
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if ((words[i] == "chunk" || words[i] == "segment") && i + 1 < words.size() && is_counter(words[i + 1])) {
      ++i;
      if (i + 1 < words.size() && words[i + 1].starts_with('['))
        while (++i < words.size() && !words[i].ends_with(']')) {
        }
      continue;
    }
    if (!out.empty()) out += ' ';
    out += words[i];
  }
  // Trailing qualifiers, in any order: " recv", " send" and hop numbers.
  for (bool cut = true; cut;) {
    const size_t sp = out.rfind(' ');
    const std::string_view last = sp == std::string::npos ? std::string_view() : std::string_view(out).substr(sp + 1);
    cut = last == "recv" || last == "send" || is_number(last);
    if (cut) out.resize(sp);
  }
  // "layers.<i>." → "layers.*." wherever it appears ("sp grad layers.3.input_layernorm.weight").
  for (size_t p = out.find("layers."); p != std::string::npos; p = out.find("layers.", p + 1)) {
    const size_t d = p + 7, e = out.find_first_not_of("0123456789", d);
    if (e != std::string::npos && e > d && out[e] == '.') out.replace(d, e - d, "*");
  }
  return out;
}

std::string_view comm_collective(std::string_view name) {
  name = name.substr(0, name.find('.'));
  for (std::string_view suffix : {"_recvs", "_sends", "_bytes"})
    if (name.ends_with(suffix)) return name.substr(0, name.size() - suffix.size());
  return name;
}

bool is_pp_recv_wait(std::string_view name) { return name == kPpRecvWaitEvent; }

std::string_view comm_group_row(std::string_view group, std::string_view name) {
  if (group.starts_with(kPpLinkPrefix) || is_pp_recv_wait(name)) return kPpGroup;
  return group;
}

}  // namespace coc::analysis::detail
