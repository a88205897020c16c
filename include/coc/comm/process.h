// The MPI process: what coc asks of the MPI library outside any communicator. Bringing MPI up, the world's size and
// this rank before a Communicator exists, the library's identity (`coc env`, the benchmark records), this rank's
// place on its node, the library's own settings (MPI_T), and ending the whole job. MPI is called only in comm/
// and the entry point (docs/design.md), so the layers above ask here.
//
// Threads: MPI is initialised with MPI_THREAD_SERIALIZED (every MPI call of coc goes through a ProgressEngine's
// mutex, progress_engine.h). These calls go to MPI directly, so call them where no other thread of this process is
// inside MPI: at start-up, or with no threaded engine running (`coc env` and the benchmarks' set-up do).
// world_size() and world_rank() read MPI once and are safe anywhere afterwards; abort_job() may be called from any
// thread (the job is ending).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace coc {

/// MPI's thread-support levels (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE), in the standard's increasing order.
enum class ThreadLevel { kSingle, kFunneled, kSerialized, kMultiple };

/// The level coc asks MPI for (init_mpi): every MPI call goes through one mutex, so SERIALIZED is enough.
inline constexpr ThreadLevel kThreadLevelRequested = ThreadLevel::kSerialized;

/// The standard's name: "MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE".
std::string to_string(ThreadLevel level);

/// MPI_Init_thread with kThreadLevelRequested; MPI may remove its own arguments from argc/argv. Call once, first in
/// main, before any thread starts. What the library granted is thread_level(). Throws kComm if MPI fails.
void init_mpi(int& argc, char**& argv);

/// The number of ranks of the job (MPI_COMM_WORLD) and this process's rank among them. Read from MPI on the first
/// call (after init_mpi), constant afterwards.
int world_size();
int world_rank();

/// The thread level MPI granted (MPI_Query_thread).
ThreadLevel thread_level();

/// The MPI library's own description (MPI_Get_library_version), without trailing newlines, spaces or NULs: one
/// line for Open MPI ("Open MPI v4.1.4, package: ..."), several for MPICH ("MPICH Version:\t4.0.2\n...").
std::string library_version();

/// "Open MPI", "MVAPICH", "Intel MPI", "MPICH" or "unknown": the vendor a library_version() text (or a part of it)
/// names. Pure; no MPI call.
std::string mpi_vendor(std::string_view library_version);

/// The MPI standard version the library implements, "major.minor" (MPI_Get_version), e.g. "3.1".
std::string standard_version();

/// This host's name as MPI sees it (MPI_Get_processor_name).
std::string processor_name();

/// Where this rank sits on its node: among the world ranks that share its memory (MPI_Comm_split_type with
/// MPI_COMM_TYPE_SHARED), its rank (ordered by world rank) and their number.
struct NodePlacement {
  int local_rank = 0;
  int local_size = 1;
};

/// Collective over the world: every rank must call it. Throws kComm if MPI fails.
NodePlacement node_placement();

/// The values of the MPI library's string control variables `names` (one per name, in order), read through the MPI
/// tool interface (MPI_T), for example Open MPI's "btl_tcp_if_include". An entry is nullopt when the library has no
/// such string variable or MPI_T is unavailable; the caller then falls back to the environment. One MPI_T session
/// reads them all: its start loads every component's parameters (~0.2 s in Open MPI 4.1 on the test VMs).
std::vector<std::optional<std::string>> control_variables(const std::vector<const char*>& names);

/// Ends every rank of the job (MPI_Abort on the world) with exit code `code`; Open MPI's mpirun and MPICH's Hydra
/// both tear the whole job down, which is the only way to free peers blocked in a collective. Before MPI_Init or
/// after MPI_Finalize, exits this process with `code` instead. Never returns.
[[noreturn]] void abort_job(int code);

}  // namespace coc
