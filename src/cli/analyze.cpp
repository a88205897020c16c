// `coc analyze PATH...`: the overlap analysis of profiler traces (coc's own, PyTorch/Kineto, Ascend), as a
// terminal table and optionally JSON, msprof-style CSV, SVG and HTML (docs/analysis.md). Single-process and
// MPI-free: main runs it before (instead of) MPI_Init, so it works without mpirun and starts instantly.
//
// Output discipline: every renderer runs before anything is written, and files are written to a temporary name
// in the same folder and renamed, so an error never leaves a partial report that looks complete.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "coc/analysis/analyze.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/progress_bar.h"

namespace coc::cli {

namespace {

namespace fs = std::filesystem;
using namespace coc::analysis;

struct AnalyzeCliOptions {
  std::vector<std::string> paths;
  std::string convention = "exact", format = "auto";
  std::vector<std::string> rank_map;
  std::string json_file, csv_file, html_file, svg_file;
  bool json = false;
  int top = 10, threads = 0;
  bool quiet = false;
};

/// "FILE=RANK" → (FILE, RANK). The split is at the last '=', so file names may contain '='.
std::pair<std::string, int> parse_rank_map(const std::string& s) {
  const size_t eq = s.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw_invalid("--rank-map '{}': expected FILE=RANK, e.g. --rank-map trace.json.gz=3", s);
  const std::string num = s.substr(eq + 1);
  size_t used = 0;
  int rank = -1;
  try {
    rank = std::stoi(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != num.size() || rank < 0)
    throw_invalid("--rank-map '{}': rank '{}' is not a non-negative integer", s, num);
  return {s.substr(0, eq), rank};
}

/// The progress bar on stderr, summed over the files being read (several in parallel). Redrawn at most every
/// 100 ms; the callback comes from the reading threads, hence the mutex.
class Progress {
 public:
  void update(const std::string& file, uint64_t done, uint64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    files_[file] = {done, total};
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    uint64_t d = 0, t = 0;
    for (const auto& [name, p] : files_) {
      d += p.first;
      t += p.second;
    }
    std::fprintf(stderr, "\r\033[K%s %3.0f%%  %zu file(s), %.0f/%.0f MB", progress_bar(int64_t(d), int64_t(t)).c_str(),
                 t ? 100.0 * d / t : 100.0, files_.size(), d / 1e6, t / 1e6);
    drawn_ = true;
  }
  ~Progress() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> files_;
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

/// "-" as a trace PATH: standard input, copied to a temporary file (the readers map and re-read files), removed when
/// the analysis is done. Its name ends in .json.gz when the bytes are gzip's, so that the readers inflate it.
class StdinTrace {
 public:
  std::string take() {
    std::string bytes((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (bytes.empty()) throw_invalid("-: standard input is empty; pipe a trace into coc analyze -, e.g. zcat t.json.gz | coc analyze -");
    const bool gz = bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
                    static_cast<unsigned char>(bytes[1]) == 0x8b;
    path_ = (fs::temp_directory_path() / fmt::format("coc-analyze-stdin.{}.{}", ::getpid(), gz ? "json.gz" : "json"))
                .string();
    write_atomically(path_, bytes);
    return path_;
  }
  ~StdinTrace() {
    std::error_code ec;
    if (!path_.empty()) fs::remove(path_, ec);
  }

 private:
  std::string path_;
};

int run_analyze(AnalyzeCliOptions o) {
  StdinTrace stdin_trace;
  for (auto& p : o.paths)
    if (p == "-") p = stdin_trace.take();
  // "-" as an output FILE: standard output, instead of the table. One report at most can go there.
  int to_stdout = 0;
  for (const std::string* out : {&o.json_file, &o.csv_file, &o.html_file, &o.svg_file}) to_stdout += *out == "-";
  if (to_stdout > 1) throw_invalid("only one of --json, --csv, --html and --svg can write to standard output ('-')");
  AnalyzeOptions opt;
  opt.convention = o.convention == "hta" ? Convention::kHta : o.convention == "ascend" ? Convention::kAscend
                                                                                     : Convention::kExact;
  opt.format = o.format == "coc"      ? TraceFormat::kCoc
               : o.format == "kineto" ? TraceFormat::kKineto
               : o.format == "ascend" ? TraceFormat::kAscend
               : o.format == "torch-cpu" ? TraceFormat::kTorchCpu
                                      : TraceFormat::kAuto;
  if (o.top < 0) throw_invalid("--top {} must be >= 0", o.top);
  if (o.threads < 0) throw_invalid("--threads {} must be >= 0 (0 = one per core)", o.threads);
  opt.top_kernels = o.top;
  opt.threads = o.threads;
  for (const auto& m : o.rank_map) {
    auto [file, rank] = parse_rank_map(m);
    if (!fs::exists(file)) throw_invalid("--rank-map '{}': {} does not exist", m, file);
    opt.rank_of_file[file] = rank;
  }
  for (const auto& p : o.paths)
    if (p != "-" && !fs::exists(p)) throw_invalid("{}: no such file or folder; give trace files (.json, .json.gz) or folders", p);
  // Never overwrite a trace with a report (a PATH typed after --csv, say).
  for (const std::string* out : {&o.json_file, &o.csv_file, &o.html_file, &o.svg_file})
    for (const auto& p : o.paths) {
      std::error_code ec;
      if (!out->empty() && *out != "-" && fs::exists(*out) && fs::equivalent(*out, p, ec))
        throw_invalid("output file {} is also an input trace; choose another output name", *out);
    }

  std::unique_ptr<Progress> progress;
  if (!o.quiet && is_terminal(STDERR_FILENO)) {
    progress = std::make_unique<Progress>();
    opt.progress = [p = progress.get()](const std::string& f, uint64_t d, uint64_t t) { p->update(f, d, t); };
  }
  Report r = analyze_paths(o.paths, opt);
  progress.reset();

  // Render everything first: a renderer error must not leave some files written and others not.
  if (o.json && o.json_file.empty()) o.json_file = "-";
  const bool report_to_stdout = o.json_file == "-" || to_stdout > 0;
  std::vector<std::pair<std::string, std::string>> files;
  std::string stdout_text;
  auto add = [&](const std::string& path, std::string text) {
    if (path == "-") stdout_text = std::move(text);
    else files.emplace_back(path, std::move(text));
  };
  if (o.json) add(o.json_file, render_json(r));
  if (!o.csv_file.empty()) add(o.csv_file, render_csv(r));
  if (!o.svg_file.empty()) add(o.svg_file, render_svg(r));
  if (!o.html_file.empty()) add(o.html_file, render_html(r));
  if (!report_to_stdout && !o.quiet)
    stdout_text = render_table(r, is_terminal(STDOUT_FILENO) && !env::is_set(env::Var::kNoColor));
  for (const auto& [path, text] : files) write_atomically(path, text);
  std::fwrite(stdout_text.data(), 1, stdout_text.size(), stdout);
  if (!o.quiet && !report_to_stdout)
    for (const auto& [path, text] : files) std::printf("wrote %s (%zu bytes)\n", path.c_str(), text.size());
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_analyze_command(CLI::App& app) {
  auto o = std::make_shared<AnalyzeCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "analyze",
      "Overlap analysis of profiler traces (coc --profile, PyTorch/Kineto, Ascend trace_view.json): per rank and "
      "step, computing, communication, overlapped, exposed communication and free time, verdicts, host-bound "
      "evidence, exposed communication per communicator and (coc traces) per operation, the part of it spent "
      "waiting for a later rank to post the collective (coc traces of several ranks), the pipeline bubble per rank "
      "(coc --pp runs), the balance of step and compute times, and top kernels. Single process; no mpirun needed. "
      "See docs/analysis.md");
  cmd->add_option("paths", o->paths, "Trace files (.json, .json.gz, trace_view.json) or folders of them; '-': "
                                     "standard input")
      ->expected(0, -1);
  cmd->add_option("--convention", o->convention,
                  "exact: integer ns, events crossing a step boundary clipped to it (default); hta: HTA's "
                  "conventions (events trimmed inward to whole us, last ProfilerStep dropped, memcpy non-compute); "
                  "ascend: msprof's (memcpy/memset count as Free)")
      ->check(CLI::IsMember({"exact", "hta", "ascend"}));
  cmd->add_option("--format", o->format,
                  "Trace format: auto (detect), coc, kineto, ascend, torch-cpu (PyTorch profiler of a CPU-only run)")
      ->check(CLI::IsMember({"auto", "coc", "kineto", "ascend", "torch-cpu"}));
  cmd->add_option("--rank-map", o->rank_map, "FILE=RANK: the rank of a trace that carries none (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--json", o->json_file, "Write the report as JSON to FILE, or to stdout (instead of the table) "
                                          "when FILE is '-' or not given")
      ->expected(0, 1);
  cmd->add_option("--csv", o->csv_file, "Write msprof-analyze step_trace_time.csv columns (µs) to FILE ('-': stdout)");
  cmd->add_option("--html", o->html_file, "Write a self-contained HTML page (charts and tables) to FILE ('-': stdout)");
  cmd->add_option("--svg", o->svg_file, "Write per-rank stacked bars and a four-lane timeline as SVG to FILE ('-': stdout)");
  cmd->add_option("--top", o->top, "Kernels to list by total device time (default 10)");
  cmd->add_option("--threads", o->threads, "Files parsed in parallel (default 0 = one per core)");
  cmd->add_flag("-q,--quiet", o->quiet, "No table and no progress bar: only the files asked for, and errors");
  return [o, cmd] {
    AnalyzeCliOptions run = *o;
    run.json = cmd->count("--json") > 0;
    // "--json" takes an optional FILE, so in "coc analyze --json traces/" CLI11 hands it the first PATH. A value
    // that is a folder or a .gz, or that leaves no PATH, is an input: the JSON then goes to stdout.
    const std::string& j = run.json_file;
    if (!j.empty() && (run.paths.empty() || fs::is_directory(j) || j.ends_with(".gz"))) {
      run.paths.insert(run.paths.begin(), j);
      run.json_file.clear();
    }
    if (run.paths.empty()) throw_invalid("coc analyze needs at least one trace file or folder (see coc analyze --help)");
    return run_analyze(run);
  };
}

}  // namespace coc::cli
