// read_training_log: the JSON lines of `coc train --log-json` (src/cli/train_metrics.h) back into points.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "coc/analysis/training_plot.h"
#include "coc/core/error.h"

namespace coc::analysis {

namespace {

TrainingRun read_lines(std::istream& in, const std::string& path) {
  TrainingRun run;
  run.file = path;
  run.label = path == "-" ? "stdin" : std::filesystem::path(path).filename().string();
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw_invalid("{}:{}: not a JSON line; coc plot reads the files of coc train --log-json", path, no);
    }
    const std::string type = j.is_object() ? j.value("type", "") : "";
    if (type == "run" && j.contains("coc_parallel_num")) {
      const auto& n = j["coc_parallel_num"];
      run.label = fmt::format("N={}", n.is_string() ? n.get<std::string>() : n.dump());
    }
    if (type == "evaluation" && j.value("split", "") == "validation") {
      if (!j.contains("iteration") || !j["iteration"].is_number() || !j.contains("loss") || !j["loss"].is_number())
        throw_invalid("{}:{}: an evaluation record without iteration or loss", path, no);
      run.validation.emplace_back(j["iteration"].get<int64_t>(), j["loss"].get<double>());
    }
    if (type != "iteration") continue;
    try {
      TrainingPoint p;
      p.iteration = j.at("iteration").get<int64_t>();
      p.loss = j.at("loss").get<double>();
      p.lr = j.at("lr").get<double>();
      p.grad_norm = j.at("grad_norm").get<double>();
      p.elapsed_ms = j.at("elapsed_ms").get<double>();
      p.tokens_per_s = j.at("tokens_per_s").get<double>();
      run.points.push_back(p);
    } catch (const nlohmann::json::exception&) {
      throw_invalid("{}:{}: an iteration record without iteration, loss, lr, grad_norm, elapsed_ms or tokens_per_s",
                    path, no);
    }
  }
  if (run.points.empty())
    throw_invalid("{}: no iteration record; pass a file written by coc train --log-json FILE", path);
  return run;
}

}  // namespace

TrainingRun read_training_log(const std::string& path) {
  if (path == "-") return read_lines(std::cin, path);
  std::ifstream f(path);
  if (!f) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw_invalid("{}: no such file; pass files written by coc train --log-json FILE", path);
    throw_error(ErrorKind::kIo, "cannot read {}: {}", path, std::strerror(errno));
  }
  return read_lines(f, path);
}

}  // namespace coc::analysis
