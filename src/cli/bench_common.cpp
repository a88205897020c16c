// bench_common.h: statistics over repetitions and ranks, the environment record, list flags, progress.
#include "cli/bench_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "coc/comm/process.h"
#include "coc/core/error.h"
#include "coc/core/median.h"
#include "coc/core/progress_bar.h"
#include "coc/kernels/blas_core.h"
#include "coc/kernels/gemm.h"
#include "coc/runtime/affinity.h"

namespace coc::cli::bench {

using nlohmann::json;

json Sample::to_json_ms() const { return {{"median", median * 1e3}, {"min", min * 1e3}, {"max", max * 1e3}}; }

Sample reduce_sample(Communicator& comm, std::vector<double> times) {
  COC_ASSERT(!times.empty(), "reduce_sample: no repetitions");
  const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
  double v[3] = {median(times), *lo, *hi};
  comm.all_reduce_values(v, ReduceOp::kMax, "bench sample");
  return {v[0], v[1], v[2]};
}

namespace {
/// The git revision of the working directory's repository ("-dirty" with local changes), or "unknown" (no git,
/// not a repository).
std::string git_revision() {
  FILE* p = popen("git describe --always --dirty --abbrev=12 2>/dev/null", "r");
  if (!p) return "unknown";
  char buf[64] = {};
  const bool got = std::fgets(buf, sizeof buf, p) != nullptr;
  pclose(p);
  std::string s = got ? std::string(buf) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// The CPU of the first processor in /proc/cpuinfo: "model name (family F model M)", or "unknown". Results from
/// different machines must not be compared, and VMs often report a generic model name.
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string name, family, model;
  auto value = [](const std::string& line) {
    std::string v = line.substr(line.find(':') + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  };
  for (std::string line; std::getline(f, line) && !line.empty();) {
    if (line.find(':') == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of("\t:"));
    if (key == "model name") name = value(line);
    if (key == "cpu family") family = value(line);
    if (key == "model") model = value(line);
  }
  if (name.empty()) return "unknown";
  return family.empty() ? name : fmt::format("{} (family {} model {})", name, family, model);
}
}  // namespace

std::vector<std::vector<double>> time_interleaved(Communicator& comm, int warmup, int reps,
                                                  const std::vector<std::function<void()>>& bodies) {
  const size_t B = bodies.size();
  std::vector<std::vector<double>> t(B);
  for (auto& v : t) v.reserve(static_cast<size_t>(reps));
  for (int round = 0; round < warmup + reps; ++round) {
    for (size_t i = 0; i < B; ++i) {
      const size_t b = (static_cast<size_t>(round) + i) % B;
      comm.barrier(round < warmup ? "bench warmup" : "bench rep");
      const auto t0 = std::chrono::steady_clock::now();
      bodies[b]();
      if (round >= warmup) t[b].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return t;
}

json environment(Communicator& world, double link_rate_gbit) {
  const std::string lib = library_version();
  const std::string first = lib.substr(0, lib.find('\n'));
  // Every rank's binding ("host: cpus"), on rank 0.
  json binding = json::array();
  const std::string mine = processor_name() + ": " + affinity_string();
  for (const std::string& b : world.gather_bytes(mine, 0, "bench binding")) binding.push_back(b);
  json j;
  j["mpi_vendor"] = mpi_vendor(first);
  j["mpi_version"] = first;
  j["mpi_standard"] = standard_version();
  j["thread_level"] = to_string(thread_level());
  j["world_size"] = world.size();
  j["binding"] = binding;
  j["cpu"] = cpu_model();
  j["blas_config"] = blas_config();
  j["blas_kernels"] = describe_blas_core(check_blas_core());
  j["blas_threads"] = blas_threads();
  j["link_rate"] = link_rate_gbit > 0 ? json(std::to_string(link_rate_gbit) + " Gbit/s (given)") : json("shared-memory");
  j["link_rate_gbit"] = link_rate_gbit > 0 ? json(link_rate_gbit) : json(nullptr);
  j["git_revision"] = world.rank() == 0 ? git_revision() : "";  // one fork per job, not per rank
  j["date"] = utc_now();
  j["coc_version"] = COC_VERSION;
  return j;
}

std::vector<std::string> parse_list(const std::string& s, const std::vector<std::string>& allowed,
                                    const std::string& flag) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
      std::string choices;
      for (const auto& a : allowed) choices += (choices.empty() ? "" : ", ") + a;
      throw_invalid("{} '{}': unknown value '{}'; choose from {}", flag, s, item, choices);
    }
    out.push_back(item);
  }
  if (out.empty()) throw_invalid("{} is empty; give a comma-separated list", flag);
  return out;
}

std::vector<int> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 1)
      throw_invalid("{} '{}': '{}' is not an integer >= 1; e.g. {} 1,2,4,8", flag, s, item, flag);
    out.push_back(v);
  }
  if (out.empty()) throw_invalid("{} is empty; e.g. {} 1,2,4,8", flag, flag);
  return out;
}

void check_writable(Communicator& world, const std::string& path, const std::string& flag) {
  int ok = 1;
  if (world.rank() == 0) {
    std::error_code ec;
    const bool existed = std::filesystem::exists(path, ec);
    ok = std::ofstream(path, std::ios::app) ? 1 : 0;
    if (ok && !existed) std::filesystem::remove(path, ec);  // a run refused later must not leave an empty file
  }
  world.broadcast_bytes(&ok, sizeof ok, 0, "bench output check").wait();
  if (!ok) throw_invalid("{} '{}': cannot create the file (does the directory exist and is it writable?)", flag, path);
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) throw_error(ErrorKind::kIo, "cannot write the benchmark record to '{}': check the directory exists", path);
  f << j.dump(2) << "\n";
  if (!f) throw_error(ErrorKind::kIo, "writing '{}' failed (disk full?)", path);
}

Progress::Progress(int rank, int total) : on_(rank == 0 && is_terminal(STDERR_FILENO)), total_(total) {}

void Progress::step(const std::string& what) {
  ++done_;
  if (on_) std::fprintf(stderr, "\r\033[K[%d/%d] %s", done_, total_, what.c_str());
}

Progress::~Progress() {
  if (on_) std::fprintf(stderr, "\r\033[K");
}

std::vector<Mesh> groups_per_engine(const std::vector<std::string>& engines, int world_size, int poll_us,
                                    const std::string& nonblocking_impl) {
  const NonblockingImpl impl = parse_nonblocking_impl(nonblocking_impl);
  std::vector<Mesh> groups;
  for (const auto& e : engines) {
    CommOptions co;
    co.engine = parse_engine_kind(e);
    co.poll_us = poll_us;
    co.nonblocking = impl;
    groups.push_back(make_mesh({.tp = world_size}, co));
  }
  return groups;
}

}  // namespace coc::cli::bench
