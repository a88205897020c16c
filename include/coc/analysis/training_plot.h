// Training curves of `coc train --log-json` files (`coc plot`): loss, learning rate, grad norm, ms per iteration
// and tokens/s against the iteration, several runs overlaid and labelled, as an SVG 1.1 image and a
// self-contained HTML page that look like `coc analyze --svg/--html` (the same fonts, colours and table style).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace coc::analysis {

/// One "iteration" record of a --log-json file.
struct TrainingPoint {
  int64_t iteration = 0;  ///< 1-based
  double loss = 0;        ///< nats
  double lr = 0;
  double grad_norm = 0;
  double elapsed_ms = 0;  ///< wall time of the iteration (slowest rank)
  double tokens_per_s = 0;
};

/// One run: its records in file order and a label for the legend.
struct TrainingRun {
  std::string file;
  std::string label;  ///< e.g. "N=4", "N=auto" (from the run record's coc_parallel_num)
  std::vector<TrainingPoint> points;
  /// The "evaluation" records of the validation split (every --eval-interval and after training), in file order:
  /// (iteration, loss in nats). Drawn as circles on the loss chart.
  std::vector<std::pair<int64_t, double>> validation;
};

/// Reads a --log-json file ("-": standard input). The label is "N=<coc_parallel_num>" from its "run" record
/// (the file's name when it has none); "evaluation" records of the validation split fill `validation`, and lines of
/// other types are skipped. Throws a uniform kInvalidArgument naming
/// the file and line for a line that is not JSON or an iteration record without its numbers, and for a file
/// with no iteration record; kIo when it cannot be read.
TrainingRun read_training_log(const std::string& path);

/// The five charts, stacked (each with its own y axis; the x axis is the iteration over all runs), and a legend.
/// Each run's line in each chart is a <polyline class="series" data-metric="loss" data-run="LABEL">; each validation
/// loss a <circle class="validation" data-run="LABEL"> on the loss chart.
std::string render_training_svg(const std::vector<TrainingRun>& runs);

/// The page: the SVG above and a table per run (first and last loss, median ms per iteration and tokens/s).
std::string render_training_html(const std::vector<TrainingRun>& runs);

}  // namespace coc::analysis
