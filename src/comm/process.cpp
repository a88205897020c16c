#include "coc/comm/process.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mpi_check.h"

namespace coc {

using detail::check_mpi;

std::string to_string(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::kSingle: return "MPI_THREAD_SINGLE";
    case ThreadLevel::kFunneled: return "MPI_THREAD_FUNNELED";
    case ThreadLevel::kSerialized: return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::kMultiple: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

void init_mpi(int& argc, char**& argv) {
  static_assert(kThreadLevelRequested == ThreadLevel::kSerialized, "init_mpi passes MPI_THREAD_SERIALIZED");
  int provided = 0;
  check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread", "start-up");
  // Errors come back to coc, which names the op (Communicator sets the same on every communicator it makes; Open
  // MPI reports a failed non-blocking collective's request on MPI_COMM_WORLD).
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "start-up");
}

int world_size() {
  static const int size = [] {
    int s = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  return size;
}

int world_rank() {
  static const int rank = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  return rank;
}

ThreadLevel thread_level() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  // The MPI_THREAD_* constants are implementation-defined integers (only their order is standard): compare, do not
  // cast.
  if (level == MPI_THREAD_MULTIPLE) return ThreadLevel::kMultiple;
  if (level == MPI_THREAD_SERIALIZED) return ThreadLevel::kSerialized;
  if (level == MPI_THREAD_FUNNELED) return ThreadLevel::kFunneled;
  return ThreadLevel::kSingle;
}

std::string library_version() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  // Open MPI counts the terminating NUL in len and ends with a newline; keep only the text.
  std::string s(lib, strnlen(lib, static_cast<size_t>(std::max(len, 0))));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string mpi_vendor(std::string_view lib) {
  if (lib.find("Open MPI") != std::string_view::npos) return "Open MPI";
  if (lib.find("MVAPICH") != std::string_view::npos) return "MVAPICH";
  if (lib.find("Intel") != std::string_view::npos) return "Intel MPI";
  if (lib.find("MPICH") != std::string_view::npos) return "MPICH";
  return "unknown";
}

std::string standard_version() {
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string processor_name() {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  return std::string(host, static_cast<size_t>(std::max(len, 0)));
}

NodePlacement node_placement() {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", "the node-local ranks");
  NodePlacement p;
  MPI_Comm_rank(node, &p.local_rank);
  MPI_Comm_size(node, &p.local_size);
  MPI_Comm_free(&node);
  return p;
}

std::vector<std::optional<std::string>> control_variables(const std::vector<const char*>& names) {
  std::vector<std::optional<std::string>> out(names.size());
  int provided = 0;
  if (names.empty() || MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return out;
  for (size_t i = 0; i < names.size(); ++i) {
    int idx = -1;
    if (MPI_T_cvar_get_index(names[i], &idx) != MPI_SUCCESS) continue;
    char vname[256], desc[1024];
    int nlen = sizeof vname, dlen = sizeof desc, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    if (MPI_T_cvar_get_info(idx, vname, &nlen, &verbosity, &type, &enumtype, desc, &dlen, &bind, &scope) !=
            MPI_SUCCESS ||
        type != MPI_CHAR)
      continue;
    MPI_T_cvar_handle h = MPI_T_CVAR_HANDLE_NULL;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(idx, nullptr, &h, &count) != MPI_SUCCESS) continue;
    // `count` is the buffer size in chars for MPI_CHAR variables; leave headroom for the terminator.
    std::vector<char> buf(static_cast<size_t>(std::max(count, 0)) + 4096, '\0');
    if (MPI_T_cvar_read(h, buf.data()) == MPI_SUCCESS) out[i] = std::string(buf.data());
    MPI_T_cvar_handle_free(&h);
  }
  MPI_T_finalize();
  return out;
}

void abort_job(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI not up (or already finalized): nobody to tell
}

}  // namespace coc
