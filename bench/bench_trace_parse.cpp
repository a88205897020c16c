// bench_trace_parse: throughput and peak memory of the trace reader (analyze_file) on a synthetic multi-GB
// trace. Targets (issue 3): >= 100 MB/s on >= 1 GB, peak RSS < 300 MB on 2 GB. Not a CTest test: timings
// belong here, not in unit tests. How to run: bench/README.md.
//
// The trace is a real Kineto trace (default: HTA's nccl_2rank_rank0, see /work/shared/traces/README.md)
// replicated N times, each copy's timestamps shifted past the previous copy, written as one valid uncompressed
// JSON file. Generation runs in a child process and the analysis in another, each measured with wait4()'s
// rusage, so the generator's memory never counts towards the reader's peak RSS (a forked child starts with
// the parent's resident set as its high-water mark, and the parent stays small).
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coc/analysis/analyze.h"
#include "coc/core/error.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw coc::Error(coc::ErrorKind::kIo, fmt::format("cannot open {}", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  if (n < 0) throw coc::Error(coc::ErrorKind::kIo, fmt::format("{}: corrupt gzip stream", path));
  return out;
}

// One event split around its "ts" value, so that each copy writes prefix + shifted ts + suffix with no JSON
// serialisation in the loop (the generator must not be the bottleneck of a multi-GB run).
struct Template {
  std::string prefix, suffix;
  double ts = 0;
  bool has_ts = false;
};

/// Child 1: writes `copies` copies of `src`'s traceEvents to `out` (plus its other top-level keys once).
void generate(const std::string& src, const std::string& out, double target_bytes) {
  json doc = json::parse(read_gz(src));
  json events = std::move(doc["traceEvents"]);
  doc.erase("traceEvents");
  double t_min = 1e300, t_max = -1e300;
  std::vector<Template> tpl;
  const std::string marker = "\"@@TS@@\"";
  for (auto& e : events) {
    Template t;
    if (e.contains("ts") && e["ts"].is_number()) {
      t.ts = e["ts"].get<double>();
      t.has_ts = true;
      const double end = t.ts + (e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0);
      if (t.ts > 0) t_min = std::min(t_min, t.ts);
      t_max = std::max(t_max, end);
      e["ts"] = "@@TS@@";
    }
    std::string s = e.dump();
    const size_t at = s.find(marker);
    if (t.has_ts) {
      t.prefix = s.substr(0, at);
      t.suffix = s.substr(at + marker.size());
    } else {
      t.prefix = s;
    }
    tpl.push_back(std::move(t));
  }
  const double shift = (t_max - t_min) + 1000.0;  // µs: copies follow each other with a 1 ms gap
  std::FILE* f = std::fopen(out.c_str(), "wb");
  if (!f) throw coc::Error(coc::ErrorKind::kIo, fmt::format("cannot write {}", out));
  std::string head = doc.dump();
  head.pop_back();  // drop the closing brace: traceEvents follows
  std::string buf = head + (doc.empty() ? "" : ",") + "\"traceEvents\":[\n";
  bool first = true;
  double written = 0;
  // Copies until the file reaches the target: at least one, never a partial copy (each stays a valid trace).
  for (size_t c = 0; c == 0 || written + static_cast<double>(buf.size()) < target_bytes; ++c) {
    for (const auto& t : tpl) {
      if (!first) buf += ",\n";
      first = false;
      buf += t.prefix;
      if (t.has_ts) {
        // ts 0 marks CUPTI faults (edge case 25 of docs/edge-cases.md): keep it 0 so every copy has the same
        // data-quality profile.
        buf += t.ts > 0 ? fmt::format("{:.3f}", t.ts + static_cast<double>(c) * shift) : std::string("0");
        buf += t.suffix;
      }
      if (buf.size() > (8u << 20)) {
        std::fwrite(buf.data(), 1, buf.size(), f);
        written += static_cast<double>(buf.size());
        buf.clear();
      }
    }
  }
  buf += "\n]}\n";
  std::fwrite(buf.data(), 1, buf.size(), f);
  if (std::fclose(f) != 0) throw coc::Error(coc::ErrorKind::kIo, fmt::format("writing {} failed (disk full?)", out));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Runs `body` in a forked child; returns its exit status and its own rusage (ru_maxrss in KiB).
int in_child(const std::function<int()>& body, rusage* ru) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_trace_parse: error: %s\n", e.what());
    }
    std::fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  wait4(pid, &status, 0, ru);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Throughput and peak RSS of coc's trace reader on a synthetic multi-GB Kineto trace (bench/README.md)"};
  std::string source = COC_SHARED_TRACES "/kineto/nccl_2rank_rank0/nccl_data.json.gz";
  std::string out = "/tmp/coc_bench_trace.json", convention = "exact";
  double size_gb = 1.0;
  bool keep = false;
  app.add_option("--source", source, "Trace to replicate (.json.gz)");
  app.add_option("--size-gb", size_gb, "Size of the generated trace in GB (1e9 bytes)");
  app.add_option("--out", out, "Where to write it (deleted afterwards unless --keep)");
  app.add_option("--convention", convention)->check(CLI::IsMember({"exact", "hta", "ascend"}));
  app.add_flag("--keep", keep, "Keep the generated file");
  CLI11_PARSE(app, argc, argv);

  if (!fs::exists(source)) {
    std::fprintf(stderr, "bench_trace_parse: error: %s does not exist; pass --source FILE.json.gz\n", source.c_str());
    return 2;
  }
  struct statvfs vfs {};
  const double need = size_gb * 1e9 * 1.05;
  if (statvfs(fs::absolute(out).parent_path().c_str(), &vfs) == 0 &&
      static_cast<double>(vfs.f_bavail) * vfs.f_frsize < need) {
    std::fprintf(stderr, "bench_trace_parse: error: %.1f GB free next to %s, %.1f GB needed; use --out or --size-gb\n",
                 static_cast<double>(vfs.f_bavail) * vfs.f_frsize / 1e9, out.c_str(), need / 1e9);
    return 2;
  }

  rusage ru{};
  auto t0 = std::chrono::steady_clock::now();
  if (in_child([&] { generate(source, out, size_gb * 1e9); return 0; }, &ru) != 0) return 1;
  const double gen_s = seconds_since(t0);
  const double bytes = static_cast<double>(fs::file_size(out));
  std::printf("generated %s: %.3f GB in %.1f s (generator peak RSS %.0f MB)\n", out.c_str(), bytes / 1e9, gen_s,
              ru.ru_maxrss / 1024.0);

  // Baseline: what an idle forked child already has resident (the parent's own footprint).
  in_child([] { return 0; }, &ru);
  const double base_mb = ru.ru_maxrss / 1024.0;

  int pipefd[2];
  if (pipe(pipefd) != 0) return 1;
  t0 = std::chrono::steady_clock::now();
  const int rc = in_child(
      [&] {
        close(pipefd[0]);
        coc::analysis::AnalyzeOptions opt;
        opt.convention = convention == "hta" ? coc::analysis::Convention::kHta
                         : convention == "ascend" ? coc::analysis::Convention::kAscend
                                                  : coc::analysis::Convention::kExact;
        opt.threads = 1;
        auto ranks = coc::analysis::analyze_file(out, opt);
        int64_t events = 0, device = 0;
        for (const auto& r : ranks) {
          events += r.events;
          device += r.device_events;
        }
        std::string msg = fmt::format("{} {} {}", ranks.size(), events, device);
        if (write(pipefd[1], msg.data(), msg.size()) < 0) return 1;
        return 0;
      },
      &ru);
  const double analyse_s = seconds_since(t0);
  close(pipefd[1]);
  char msg[128] = {0};
  if (read(pipefd[0], msg, sizeof msg - 1) < 0) msg[0] = 0;
  close(pipefd[0]);
  if (!keep) fs::remove(out);
  if (rc != 0) {
    std::fprintf(stderr, "bench_trace_parse: analysis failed (exit %d)\n", rc);
    return 1;
  }
  long ranks = 0, events = 0, device = 0;
  std::sscanf(msg, "%ld %ld %ld", &ranks, &events, &device);
  const double mbps = bytes / 1e6 / analyse_s;
  const double peak_mb = ru.ru_maxrss / 1024.0;
  std::printf("analyze_file: %.3f GB, %ld events (%ld device) in %.2f s = %.0f MB/s; peak RSS %.0f MB "
              "(baseline child %.0f MB); convention %s\n",
              bytes / 1e9, events, device, analyse_s, mbps, peak_mb, base_mb, convention.c_str());
  std::printf("targets: >= 100 MB/s on >= 1 GB: %s; peak RSS < 300 MB on 2 GB: %s\n",
              bytes < 1e9 ? "n/a (file < 1 GB)" : mbps >= 100 ? "met" : "MISSED",
              bytes < 2e9 ? "n/a (file < 2 GB)" : peak_mb < 300 ? "met" : "MISSED");
  return 0;
}
