// `coc plot RUN.jsonl...`: training curves of `coc train --log-json` files, several runs overlaid (for example
// N = 1 against auto), as an SVG and a self-contained HTML page (include/coc/analysis/training_plot.h).
// Single-process and MPI-free, like `coc analyze`: main runs it without MPI_Init.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "coc/analysis/training_plot.h"
#include "coc/core/error.h"

namespace coc::cli {

namespace {

struct PlotOptions {
  std::vector<std::string> files, labels;
  std::string out = "coc_plot", svg, html;
  bool quiet = false;
};

int run_plot(const PlotOptions& o) {
  if (o.files.empty()) throw_invalid("coc plot needs at least one file of coc train --log-json (see coc plot --help)");
  if (!o.labels.empty() && o.labels.size() != o.files.size())
    throw_invalid("coc plot: {} --label for {} file(s); give one label per file, in order", o.labels.size(),
                  o.files.size());
  if (std::count(o.files.begin(), o.files.end(), std::string("-")) > 1)
    throw_invalid("coc plot: standard input ('-') can be read once");
  std::vector<analysis::TrainingRun> runs;
  for (const auto& f : o.files) runs.push_back(analysis::read_training_log(f));
  // Two runs with the same settings would share a label: add the file name.
  std::multiset<std::string> seen;
  for (const auto& r : runs) seen.insert(r.label);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!o.labels.empty()) runs[i].label = o.labels[i];
    else if (seen.count(runs[i].label) > 1) runs[i].label += " (" + runs[i].file + ")";
  }
  const std::string svg = o.svg.empty() ? o.out + ".svg" : o.svg, html = o.html.empty() ? o.out + ".html" : o.html;
  if (svg == "-" && html == "-") throw_invalid("coc plot: only one of --svg and --html can write to standard output");
  const std::pair<std::string, std::string> outs[] = {{svg, analysis::render_training_svg(runs)},
                                                      {html, analysis::render_training_html(runs)}};
  std::string to_stdout;
  for (const auto& [path, text] : outs) {
    if (path == "-") to_stdout = text;
    else write_atomically(path, text);
  }
  std::fwrite(to_stdout.data(), 1, to_stdout.size(), stdout);
  if (!o.quiet && to_stdout.empty())
    for (const auto& [path, text] : outs) std::printf("wrote %s (%zu bytes)\n", path.c_str(), text.size());
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_plot_command(CLI::App& app) {
  auto o = std::make_shared<PlotOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "Training curves of coc train --log-json files (loss with the validation losses, learning rate, grad norm, "
      "ms per iteration, tokens/s against the iteration), several runs overlaid, as an SVG and a self-contained HTML page. Single process");
  cmd->add_option("files", o->files, "JSON-lines files of coc train --log-json ('-': standard input)")->expected(0, -1);
  cmd->add_option("-o,--output", o->out, "Write OUTPUT.svg and OUTPUT.html")->capture_default_str();
  cmd->add_option("--svg", o->svg, "Write the SVG to FILE instead ('-': stdout)");
  cmd->add_option("--html", o->html, "Write the HTML page to FILE instead ('-': stdout)");
  cmd->add_option("--label", o->labels, "Legend label of each file, in order (default: N=<coc-parallel-num>)")
      ->allow_extra_args(false);
  cmd->add_flag("-q,--quiet", o->quiet, "Do not list the files written");
  return [o] { return run_plot(*o); };
}

}  // namespace coc::cli
