// `coc env`: what this job runs on, and what is wrong with it.
//
// Prints (rank 0, after gathering every rank's view): the MPI library and vendor, the MPI standard version, the
// thread level MPI granted, the world size and hosts, a per-rank table (host, node-local rank, CPU affinity,
// usable cores, BLAS threads), the BLAS build, cores and /dev/shm free space per host, and WARNINGS, each with
// its fix, for the deployment faults of edge cases 14-19 of docs/edge-cases.md:
//   run-as-root          root without OMPI_ALLOW_RUN_AS_ROOT (and _CONFIRM), outside scripts/launch / mpirun (14)
//   oversubscribed       more ranks on a host than it has cores (14)
//   blas-single-core     a rank bound to one core but running > 1 BLAS thread (15, 16)
//   blas-threads         BLAS threads × ranks on a host > its cores (16)
//   shm-small            /dev/shm free < 256 MiB on a host (17)
//   binding-overlap      two bound ranks on one host that share a CPU (15)
//   tcp-interface        ranks on several hosts and no TCP interface chosen (19)
//   thread-level         MPI granted less than MPI_THREAD_SERIALIZED (the threaded progress engine needs it)
//   blas-core            OpenBLAS runs the fp32 GEMMs (--gemm-backend openblas, or auto on a CPU without AVX-512)
//                        with kernels below what the CPU supports (coc/kernels/blas_core.h): a fallback coc could
//                        not switch (OPENBLAS_CORETYPE set to a weak core by hand, or the re-exec failed), or AVX2
//                        kernels on an AVX-512 CPU, which coc never overrides
//   bf16-emulated        the CPU has no bf16 dot products (AVX512_BF16, AMX): oneDNN emulates bf16 GEMMs, or has
//                        none, so bf16 GEMMs run slower than fp32 or not at all
// With --verbose it also prints the transport per pair of ranks (same host: shared memory; else TCP with its
// interface setting, read through MPI_T when the library exposes it, else from OMPI_MCA_btl_tcp_if_include;
// edge case 19) and every environment variable of the registry (coc/core/env_registry.h).
// --json prints the same as one JSON object. The hidden --fail-on-rank R makes rank R throw a rank-local error
// while the other ranks wait in a collective: tests/cli/rank_failure.sh checks that the whole job then dies
// quickly, naming the rank (edge case 18).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "coc/comm/communicator.h"
#include "coc/comm/process.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/kernels/blas_core.h"
#include "coc/kernels/gemm.h"
#include "coc/runtime/affinity.h"

namespace coc::cli {
namespace {

using nlohmann::json;

constexpr int64_t kShmMinBytes = 256ll << 20;  // below this, vader and node-shared windows risk SIGBUS (17)

struct EnvOptions {
  bool json = false;
  bool verbose = false;
  int fail_on_rank = -1;
};

std::string human_bytes(int64_t b) {
  if (b < 0) return "unknown";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

/// The first line, tabs as spaces (MPICH's reads "MPICH Version:<TAB>4.0.2").
std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  std::replace(l.begin(), l.end(), '\t', ' ');
  return l;
}

/// This rank's view of its placement, serialised to JSON for the gather to rank 0.
json local_info(const Communicator& world, const NodePlacement& node, const std::string& vendor) {
  json j;
  j["rank"] = world.rank();
  j["host"] = processor_name();
  j["pid"] = static_cast<int64_t>(getpid());
  j["local_rank"] = node.local_rank;
  j["local_size"] = node.local_size;
  j["cpus"] = allowed_cpus();
  j["affinity"] = affinity_string();
  j["allowed_cores"] = allowed_core_count();
  j["online_cores"] = online_core_count();
  j["blas_threads"] = blas_threads();
  j["openblas_num_threads"] = env::get(env::Var::kOpenblasNumThreads);
  const BlasCoreCheck core = check_blas_core();
  const BlasCoreAdvice advice = blas_core_advice(core);
  j["blas_core"] = {{"core", core.core},
                    {"description", describe_blas_core(core)},
                    {"core_level", core.core_level},
                    {"cpu_level", core.cpu_level},
                    {"recommended", core.recommended},
                    {"needs_fix", core.needs_fix()},
                    {"below_cpu", core.below_cpu()},
                    {"advice", advice.message},
                    {"advice_fix", advice.fix}};
  const OneDnnInfo dnn = onednn_info();
  j["gemm"] = {{"backend", to_string(gemm_backend())},
               {"onednn_version", dnn.version},
               {"onednn_isa", dnn.isa},
               {"f32_kernel", dnn.f32_kernel},
               {"bf16_kernel", dnn.bf16_kernel},
               {"bf16_native", dnn.bf16_native},
               {"amx_unused", dnn.amx_unused}};
  j["shm_free_bytes"] = shm_free_bytes();
  j["euid"] = static_cast<int64_t>(geteuid());
  // The TCP interface setting as the library sees it (MPI_T), else as the environment requests it. An include list
  // is always a deliberate choice; an exclude list usually is Open MPI's default ("lo" or 127.0.0.1/8), so it
  // counts as chosen only when the user set it in the environment.
  std::string tcp_if, tcp_if_source = "default";
  bool tcp_if_chosen = false;
  if (vendor == "Open MPI") {
    const auto cvars = control_variables({"btl_tcp_if_include", "btl_tcp_if_exclude", "btl"});
    if (const auto& v = cvars[0]; v && !v->empty()) {
      tcp_if = "include " + *v;
      tcp_if_source = "MPI_T btl_tcp_if_include";
      tcp_if_chosen = true;
    } else if (auto e = env::raw(env::Var::kOmpiBtlTcpIfInclude); e && !e->empty()) {
      tcp_if = "include " + *e;
      tcp_if_source = "OMPI_MCA_btl_tcp_if_include";
      tcp_if_chosen = true;
    } else if (const auto& x = cvars[1]; x && !x->empty()) {
      tcp_if = "every interface except " + *x;
      tcp_if_source = "MPI_T btl_tcp_if_exclude";
      tcp_if_chosen = env::is_set(env::Var::kOmpiBtlTcpIfExclude);
    }
    if (const auto& b = cvars[2]; b && !b->empty()) j["btl"] = *b;
    else if (auto eb = env::raw(env::Var::kOmpiBtl); eb && !eb->empty()) j["btl"] = *eb;
  }
  j["tcp_interface"] = tcp_if.empty() ? "all non-loopback interfaces (library default)" : tcp_if;
  j["tcp_interface_source"] = tcp_if_source;
  j["tcp_interface_set"] = tcp_if_chosen;
  return j;
}

/// Gathers every rank's JSON to rank 0. Returns the array on rank 0 and an empty array elsewhere.
json gather_to_root(Communicator& world, const json& mine) {
  json out = json::array();
  for (const std::string& s : world.gather_bytes(mine.dump(), 0, "coc env ranks")) out.push_back(json::parse(s));
  return out;
}

void warn(json& warnings, const std::string& id, const std::string& message, const std::string& fix) {
  warnings.push_back({{"id", id}, {"message", message}, {"fix", fix}});
}

/// The transport Open MPI / MPICH uses between two ranks, from locality and the btl selection.
std::string transport(bool same_host, const std::string& vendor, const std::string& btl) {
  const bool ompi = vendor == "Open MPI";
  if (same_host) {
    if (!ompi) return "shared memory (intra-node shm)";
    // An explicit btl list without vader (or one that excludes it with ^) sends same-host traffic over TCP.
    const bool excluded = !btl.empty() && (btl[0] == '^' ? btl.find("vader") != std::string::npos
                                                         : btl.find("vader") == std::string::npos &&
                                                               btl.find("sm") == std::string::npos);
    return excluded ? "tcp (btl list '" + btl + "' excludes vader)" : "shared memory (btl vader)";
  }
  return ompi ? "tcp (btl tcp)" : "network (netmod)";
}

/// 14: run as root. Under mpirun (OMPI_COMM_WORLD_SIZE set) root was already accepted; a singleton run as root
/// works, but the same user's `mpirun -n 2` will be refused.
void check_run_as_root(json& w, const json& r0, const std::string& vendor) {
  if (vendor != "Open MPI" || r0["euid"] != 0) return;
  const bool allowed = env::get(env::Var::kOmpiAllowRunAsRoot) == "1" &&
                       env::get(env::Var::kOmpiAllowRunAsRootConfirm) == "1";
  const bool launched = !env::get(env::Var::kLauncher).empty() || env::is_set(env::Var::kOmpiCommWorldSize);
  if (!allowed && !launched)
    warn(w, "run-as-root",
         "running as root: Open MPI's mpirun refuses to start ranks as root (and refuses more ranks than cores "
         "without --oversubscribe)",
         "launch with scripts/launch -n N -- build/bin/coc ... (it adds --allow-run-as-root and --oversubscribe "
         "when needed), or export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
}

/// 15/16: each rank's BLAS threads against the cores it may use; returns the host's total of BLAS threads.
int check_blas_single_core(json& w, const std::vector<const json*>& rs) {
  int threads = 0;
  for (const json* r : rs) {
    const int t = (*r)["blas_threads"].get<int>();
    threads += t;
    if ((*r)["allowed_cores"].get<int>() == 1 && t > 1)
      warn(w, "blas-single-core",
           fmt::format("rank {} is bound to one core (cpu {}) but runs {} BLAS threads: they all share that core",
                       (*r)["rank"].get<int>(), (*r)["affinity"].get<std::string>(), t),
           "export OPENBLAS_NUM_THREADS=1 (scripts/launch does), or give each rank N cores (mpirun --map-by "
           "slot:pe=N --bind-to core) and set OPENBLAS_NUM_THREADS=N");
  }
  return threads;
}

/// The GEMM kernels of one host, one warning of each kind at most (every rank of a host runs the same library on
/// the same CPU):
///  - blas-core: coc switches a fallback core of OpenBLAS at start-up (select_blas_core), so this fires for a
///    fallback only when that could not happen (a weak OPENBLAS_CORETYPE set by hand, or a failed exec), and for
///    AVX2 kernels on an AVX-512 CPU, which coc reports without overriding (BlasCoreCheck::below_cpu).
///  - bf16-emulated: bf16 without bf16 units. Measured with oneDNN 2.6 limited to AVX-512 without BF16
///    (ONEDNN_MAX_CPU_ISA=AVX512_CORE) on a Zen 5 core: a [1024, 512]·[512, 1408] bf16 matmul ran "gemm:jit" at a
///    third of the fp32 rate; limited to AVX2 it had no bf16 matmul at all (docs/performance.md, point 26).
void check_gemm_kernels(json& w, const std::vector<const json*>& rs) {
  for (const json* r : rs) {
    const json& bc = (*r)["blas_core"];
    if (!bc["below_cpu"].get<bool>() || (*r)["gemm"]["backend"] != "openblas") continue;
    warn(w, "blas-core", fmt::format("rank {}: {}", (*r)["rank"].get<int>(), bc["advice"].get<std::string>()),
         bc["advice_fix"].get<std::string>());
    break;
  }
  for (const json* r : rs) {
    const json& g = (*r)["gemm"];
    if (g["bf16_native"].get<bool>()) continue;
    const std::string kernel = g["bf16_kernel"].get<std::string>();
    warn(w, "bf16-emulated",
         kernel.empty()
             ? fmt::format("rank {}: oneDNN has no bf16 matmul on this CPU (ISA {}): bf16 GEMMs cannot run here",
                           (*r)["rank"].get<int>(), g["onednn_isa"].get<std::string>())
             : fmt::format("rank {}: the CPU has no bf16 dot products (ISA {}): oneDNN emulates bf16 GEMMs ({}), "
                           "about 3x slower than fp32 (measured on AVX-512 without BF16)",
                           (*r)["rank"].get<int>(), g["onednn_isa"].get<std::string>(), kernel),
         "compute in fp32 here, or use a CPU with AVX512_BF16 or AMX (Intel Cooper Lake or Sapphire Rapids and "
         "later, AMD Zen 4 and later)");
    break;
  }
  for (const json* r : rs) {
    const json& g = (*r)["gemm"];
    if (!g["amx_unused"].get<bool>()) continue;
    warn(w, "bf16-no-amx",
         fmt::format("rank {}: this CPU has AMX-BF16, but oneDNN runs bf16 GEMMs on {} (ISA {}): on Emerald Rapids "
                     "that made --bf16 training 2.8x slower than on AMX, and slower than fp32",
                     (*r)["rank"].get<int>(), g["bf16_kernel"].get<std::string>(),
                     g["onednn_isa"].get<std::string>()),
         "unset ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) if it is set; AMX needs Linux 5.16 or later");
    break;
  }
}

/// 15: two ranks of one host whose CPU sets intersect while at least one of them is bound (a rank bound to
/// everything, i.e. --bind-to none, is a deliberate choice and reported by `oversubscribed` instead).
void check_binding_overlap(json& w, const std::string& host, const std::vector<const json*>& rs, int cores) {
  for (size_t a = 0; a < rs.size(); ++a)
    for (size_t b = a + 1; b < rs.size(); ++b) {
      const json& ra = *rs[a];
      const json& rb = *rs[b];
      const bool bound = ra["allowed_cores"].get<int>() < cores || rb["allowed_cores"].get<int>() < cores;
      if (!bound) continue;
      std::vector<int> ca = ra["cpus"].get<std::vector<int>>(), cb = rb["cpus"].get<std::vector<int>>(), both;
      std::set_intersection(ca.begin(), ca.end(), cb.begin(), cb.end(), std::back_inserter(both));
      if (!both.empty())
        warn(w, "binding-overlap",
             fmt::format("ranks {} and {} on host {} share cpu {} (affinity {} and {}): they compete for it while "
                         "other cores idle",
                         ra["rank"].get<int>(), rb["rank"].get<int>(), host, format_cpu_list(both),
                         ra["affinity"].get<std::string>(), rb["affinity"].get<std::string>()),
             "bind each rank to its own cores (mpirun --bind-to core --map-by core; scripts/launch does this when "
             "ranks <= cores), or --bind-to none when oversubscribed");
    }
}

/// Every check of edge cases 14-17 that concerns one host's ranks `rs`.
void check_host(json& w, const std::string& host, const std::vector<const json*>& rs) {
  const int cores = (*rs[0])["online_cores"].get<int>();
  const int nranks = static_cast<int>(rs.size());
  // 14: oversubscription.
  if (nranks > cores)
    warn(w, "oversubscribed",
         fmt::format("host {} runs {} ranks on {} cores (oversubscribed): ranks time-slice, and every collective "
                     "waits for descheduled peers, so timings mean little",
                     host, nranks, cores),
         fmt::format("run at most {} ranks per host for measurements; otherwise Open MPI needs --oversubscribe "
                     "and --bind-to none (scripts/launch adds both). MPICH/UCX busy-polls and is unusable "
                     "oversubscribed (docs/performance.md)",
                     cores));
  const int threads = check_blas_single_core(w, rs);
  check_gemm_kernels(w, rs);
  // Only when some rank runs more than one thread: with one thread per rank the cause is the rank count,
  // which `oversubscribed` reports.
  if (threads > cores && threads > nranks)
    warn(w, "blas-threads",
         fmt::format("host {}: {} ranks run {} BLAS threads in total on {} cores: BLAS threads spin-wait and "
                     "thrash when they outnumber cores",
                     host, nranks, threads, cores),
         fmt::format("set OPENBLAS_NUM_THREADS to cores / ranks per host = {} (scripts/launch exports 1)",
                     std::max(1, cores / nranks)));
  // 17: /dev/shm.
  const int64_t shm = (*rs[0])["shm_free_bytes"].get<int64_t>();
  if (shm < kShmMinBytes)
    warn(w, "shm-small",
         fmt::format("host {}: /dev/shm has {} free (< {}): shared-memory transports die with SIGBUS when it "
                     "fills",
                     host, human_bytes(shm), human_bytes(kShmMinBytes)),
         "enlarge it (docker run --shm-size=1g, or mount -o remount,size=1g /dev/shm), or move Open MPI's "
         "segments: export OMPI_MCA_btl_vader_backing_directory=/tmp");
  check_binding_overlap(w, host, rs, cores);
}

/// Rank 0: every check of edge cases 14-19 over the gathered per-rank info.
json diagnose(const json& ranks, const std::string& vendor, ThreadLevel thread_level) {
  json w = json::array();
  const json& r0 = ranks[0];
  check_run_as_root(w, r0, vendor);

  std::map<std::string, std::vector<const json*>> by_host;
  for (const auto& r : ranks) by_host[r["host"].get<std::string>()].push_back(&r);
  for (const auto& [host, rs] : by_host) check_host(w, host, rs);

  // 19: several hosts and no interface chosen.
  if (by_host.size() > 1 && !r0["tcp_interface_set"].get<bool>() && vendor == "Open MPI")
    warn(w, "tcp-interface",
         fmt::format("{} hosts and no TCP interface selected: Open MPI stripes over every non-loopback interface, "
                     "and a slow or unroutable one makes collectives up to 100x slower",
                     by_host.size()),
         "export OMPI_MCA_btl_tcp_if_include=<interface or CIDR> (e.g. eth0 or 10.0.0.0/24) on every rank; check "
         "with coc env --verbose");

  if (thread_level < ThreadLevel::kSerialized)
    warn(w, "thread-level",
         fmt::format("MPI granted {}; coc's threaded progress engine (--comm-engine thread) needs "
                     "MPI_THREAD_SERIALIZED",
                     to_string(thread_level)),
         "use --comm-engine inline, or an MPI built with thread support (Debian's Open MPI and MPICH grant "
         "MPI_THREAD_MULTIPLE)");
  return w;
}

json transports(const json& ranks, const std::string& vendor) {
  json out = json::array();
  const std::string btl = ranks[0].contains("btl") ? ranks[0]["btl"].get<std::string>() : "";
  for (size_t a = 0; a < ranks.size(); ++a)
    for (size_t b = a + 1; b < ranks.size(); ++b) {
      const bool same = ranks[a]["host"] == ranks[b]["host"];
      json t = {{"from", ranks[a]["rank"]}, {"to", ranks[b]["rank"]}, {"same_host", same},
                {"transport", transport(same, vendor, btl)}};
      if (!same) {
        t["interface"] = ranks[a]["tcp_interface"];
        t["interface_source"] = ranks[a]["tcp_interface_source"];
      }
      out.push_back(t);
    }
  return out;
}

json registry_json() {
  json out = json::array();
  for (const auto& s : env::all()) {
    auto v = env::raw(s.var);
    out.push_back({{"name", s.name},
                   {"value", v ? json(*v) : json(nullptr)},
                   {"default", s.default_value},
                   {"reader", s.reader},
                   {"help", s.help}});
  }
  return out;
}

void print_text(const json& j, bool verbose) {
  const json& m = j["mpi"];
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) { out += fmt::format("{:<18}{}\n", k + ":", v); };
  line("coc", j["coc_version"].get<std::string>());
  line("MPI library", first_line(m["library_version"].get<std::string>()));
  line("MPI vendor", m["vendor"].get<std::string>());
  line("MPI standard", m["standard"].get<std::string>());
  line("thread level", fmt::format("{} (coc requests {})", m["thread_level"].get<std::string>(),
                                   m["thread_level_requested"].get<std::string>()));
  line("world size", fmt::format("{} rank(s) on {} host(s)", j["world_size"].get<int>(), j["hosts"].size()));
  line("launcher", j["launcher"].get<std::string>());
  line("BLAS", j["blas"]["config"].get<std::string>());
  line("BLAS kernels", j["ranks"][0]["blas_core"]["description"].get<std::string>() + " on rank 0");
  const json& g = j["ranks"][0]["gemm"];
  line("GEMM back end", fmt::format("{} for fp32 on rank 0 (--gemm-backend, COC_GEMM_BACKEND); oneDNN for bf16; "
                                    "fp16 (--fp16) converts: fp16 values on the fp32 kernels (no fp16 dot products)",
                                    g["backend"].get<std::string>()));
  line("oneDNN", fmt::format("{}, ISA {}: fp32 {}, bf16 {} ({})", g["onednn_version"].get<std::string>(),
                             g["onednn_isa"].get<std::string>(), g["f32_kernel"].get<std::string>(),
                             g["bf16_kernel"].get<std::string>().empty() ? "none" : g["bf16_kernel"].get<std::string>(),
                             g["bf16_native"].get<bool>() ? "native" : "emulated"));
  const std::string obt = j["ranks"][0]["openblas_num_threads"].get<std::string>();
  line("BLAS threads", fmt::format("{} on rank 0 (OPENBLAS_NUM_THREADS={})", j["blas"]["threads"].get<int>(),
                                   obt.empty() ? "unset" : obt));
  for (const auto& h : j["hosts"])
    line("host " + h["host"].get<std::string>(),
         fmt::format("{} cores, {} rank(s), /dev/shm free {}", h["cores"].get<int>(), h["ranks"].get<int>(),
                     human_bytes(h["shm_free_bytes"].get<int64_t>())));
  out += "\nranks:\n";
  out += fmt::format("  {:>4}  {:<20} {:>5}  {:<12} {:>5}  {:>12}\n", "rank", "host", "local", "affinity", "cores",
                     "blas threads");
  for (const auto& r : j["ranks"])
    out += fmt::format("  {:>4}  {:<20} {:>5}  {:<12} {:>5}  {:>12}\n", r["rank"].get<int>(),
                       r["host"].get<std::string>(), r["local_rank"].get<int>(), r["affinity"].get<std::string>(),
                       r["allowed_cores"].get<int>(), r["blas_threads"].get<int>());
  if (verbose) {
    out += "\ntransports (edge case 19):\n";
    if (j["transports"].empty()) out += "  (single rank: no peers)\n";
    for (const auto& t : j["transports"]) {
      out += fmt::format("  rank {} <-> rank {}: {}", t["from"].get<int>(), t["to"].get<int>(),
                         t["transport"].get<std::string>());
      if (t.contains("interface"))
        out += fmt::format(", interface: {} (from {})", t["interface"].get<std::string>(),
                           t["interface_source"].get<std::string>());
      out += "\n";
    }
    out += "\nenvironment (coc/core/env_registry.h):\n";
    for (const auto& e : j["environment"])
      out += fmt::format("  {}={}  [{}; default '{}']\n      {}\n", e["name"].get<std::string>(),
                         e["value"].is_null() ? "(unset)" : e["value"].get<std::string>(),
                         e["reader"].get<std::string>(), e["default"].get<std::string>(),
                         e["help"].get<std::string>());
  }
  out += "\n";
  if (j["warnings"].empty()) {
    out += "WARNINGS: none\n";
  } else {
    out += fmt::format("WARNINGS ({}):\n", j["warnings"].size());
    for (const auto& w : j["warnings"])
      out += fmt::format("  [{}] {}\n      fix: {}\n", w["id"].get<std::string>(), w["message"].get<std::string>(),
                         w["fix"].get<std::string>());
  }
  std::fputs(out.c_str(), stdout);
}

/// --fail-on-rank: rank `victim` throws a rank-local error after a barrier while every other rank waits in an
/// all-reduce that can only finish if the victim joins. Exercises the error policy end to end (edge case 18).
void inject_failure(Communicator& world, int victim) {
  if (victim >= world.size())
    throw_invalid("--fail-on-rank {} but the job has only {} rank(s) (valid: 0..{})", victim, world.size(),
                  world.size() - 1);
  world.barrier("fail-on-rank");
  if (world.rank() == victim)
    throw_error(ErrorKind::kInternal, "injected failure (--fail-on-rank {}) while peers wait in all_reduce", victim);
  float x = 1.0f;
  world.all_reduce(&x, 1, ReduceOp::kSum, "waiting for rank " + std::to_string(victim)).wait();
  throw_error(ErrorKind::kInternal, "rank {} was expected to fail, but the all_reduce completed", victim);
}

// The process queries below (process.h) call MPI directly, not through ProgressEngine::call: the inline engine
// has no thread, so only this thread is ever inside MPI.
int run_env(const EnvOptions& opt) {
  CommOptions copts;  // inline engine: env makes only blocking calls, no thread is needed
  auto engine = std::make_shared<ProgressEngine>(copts.engine, copts.poll_us);
  const std::unique_ptr<Communicator> world_comm = Communicator::world("world", engine, copts);
  Communicator& world = *world_comm;
  if (opt.fail_on_rank >= 0) inject_failure(world, opt.fail_on_rank);

  const std::string library = library_version();
  const std::string vendor = mpi_vendor(library);
  const ThreadLevel level = thread_level();

  json mine = local_info(world, node_placement(), vendor);
  json ranks = gather_to_root(world, mine);
  if (world.rank() != 0) return 0;

  json j;
  j["coc_version"] = COC_VERSION;
  j["mpi"] = {{"library_version", library},
              {"vendor", vendor},
              {"standard", standard_version()},
              {"thread_level", to_string(level)},
              {"thread_level_requested", to_string(kThreadLevelRequested)}};
  j["world_size"] = world.size();
  const std::string launcher = env::get(env::Var::kLauncher);
  j["launcher"] = !launcher.empty() ? launcher
                  : env::is_set(env::Var::kOmpiCommWorldSize) ? "mpirun"
                  : env::is_set(env::Var::kPmiSize)            ? "mpiexec (Hydra)"
                                                               : "none (singleton)";
  j["blas"] = {{"config", blas_config()}, {"threads", blas_threads()}};
  j["cores"] = online_core_count();
  j["dev_shm_free_bytes"] = shm_free_bytes();
  j["ranks"] = ranks;
  std::map<std::string, json> hosts;
  for (const auto& r : ranks) {
    json& h = hosts[r["host"].get<std::string>()];
    if (h.is_null())
      h = {{"host", r["host"]}, {"cores", r["online_cores"]}, {"ranks", 0}, {"shm_free_bytes", r["shm_free_bytes"]}};
    h["ranks"] = h["ranks"].get<int>() + 1;
  }
  j["hosts"] = json::array();
  for (auto& [name, h] : hosts) j["hosts"].push_back(h);
  j["warnings"] = diagnose(ranks, vendor, level);
  if (opt.verbose) {  // N² pairs and ~15 variables: only on request, in text and JSON alike
    j["transports"] = transports(ranks, vendor);
    j["environment"] = registry_json();
  }

  if (opt.json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    print_text(j, opt.verbose);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_env_command(CLI::App& app) {
  auto opt = std::make_shared<EnvOptions>();
  CLI::App* cmd = app.add_subcommand(
      "env", "Print the MPI library, thread level, per-rank binding and BLAS threads, /dev/shm space, and warnings "
             "(with fixes) for deployment faults: root, oversubscription, BLAS threads, small /dev/shm, overlapping "
             "bindings, TCP interface");
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of text");
  cmd->add_flag("-v,--verbose", opt->verbose,
                "Also print the transport between every pair of ranks and every environment variable coc knows");
  // Hidden (empty group): a test hook for the error policy, not a user feature.
  cmd->add_option("--fail-on-rank", opt->fail_on_rank,
                  "Debug: make this rank throw a rank-local error while the others wait in a collective")
      ->check(CLI::NonNegativeNumber)
      ->group("");
  return [opt] { return run_env(*opt); };
}

}  // namespace coc::cli
