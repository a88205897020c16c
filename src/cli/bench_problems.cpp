// Loading bench/inputs/*.yaml (bench_problems.h) with yaml-cpp; every mistake is one uniform line naming the file.
#include "cli/bench_problems.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "coc/core/error.h"

namespace coc::cli::bench {

const std::vector<std::string>& bench_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  return ops;
}

namespace {
int64_t positive(const YAML::Node& n, const char* key, const std::string& where) {
  if (!n[key]) throw_invalid("{}: missing '{}' (a positive integer)", where, key);
  int64_t v = 0;
  try {
    v = n[key].as<int64_t>();
  } catch (const YAML::Exception&) {
    throw_invalid("{}: '{}' must be a positive integer, got '{}'", where, key, n[key].Scalar());
  }
  if (v < 1) throw_invalid("{}: '{}' must be >= 1, got {}", where, key, v);
  return v;
}
}  // namespace

ProblemFile load_problems(const std::string& path, int run_tp, double m_scale, const std::string& only) {
  if (std::filesystem::is_directory(path))
    throw_invalid("bench inputs file '{}' is a directory; give one YAML file such as bench/inputs/reference.yaml",
                  path);
  if (!std::filesystem::is_regular_file(path))
    throw_invalid("bench inputs file '{}' does not exist; see bench/inputs/ for the shipped problem files", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw_invalid("bench inputs file '{}' is not valid YAML: {} (line {})", path, e.msg, e.mark.line + 1);
  }
  if (!root.IsMap()) throw_invalid("bench inputs file '{}': expected a map with model, tp and problems", path);
  static const std::set<std::string> top = {"model", "tp", "notes", "problems"};
  for (const auto& kv : root)
    if (!top.count(kv.first.as<std::string>()))
      throw_invalid("bench inputs file '{}': unknown key '{}' (allowed: model, tp, notes, problems)", path,
                    kv.first.as<std::string>());
  ProblemFile f;
  f.path = path;
  if (!root["model"]) throw_invalid("bench inputs file '{}': missing 'model' (e.g. model: LLaMA2-7B)", path);
  f.model = root["model"].as<std::string>();
  f.tp = static_cast<int>(positive(root, "tp", "bench inputs file '" + path + "'"));
  if (root["notes"]) f.notes = root["notes"].as<std::string>();
  const YAML::Node probs = root["problems"];
  if (!probs || !probs.IsSequence() || probs.size() == 0)
    throw_invalid("bench inputs file '{}': 'problems' must be a non-empty list of {{name, layer, m, k, n}}", path);
  std::set<std::string> names;
  for (size_t i = 0; i < probs.size(); ++i) {
    const YAML::Node p = probs[i];
    const std::string where = fmt::format("bench inputs file '{}', problem {}", path, i + 1);
    if (!p.IsMap()) throw_invalid("{}: expected a map with name, layer, m, k, n", where);
    static const std::set<std::string> keys = {"name", "layer", "m", "k", "n", "ops"};
    for (const auto& kv : p)
      if (!keys.count(kv.first.as<std::string>()))
        throw_invalid("{}: unknown key '{}' (allowed: name, layer, m, k, n, ops)", where, kv.first.as<std::string>());
    Problem pr;
    if (!p["name"]) throw_invalid("{}: missing 'name'", where);
    pr.name = p["name"].as<std::string>();
    if (!names.insert(pr.name).second) throw_invalid("{}: duplicate problem name '{}'", where, pr.name);
    if (!only.empty() && pr.name != only) continue;  // only the selected problem must fit this run
    const std::string w2 = fmt::format("bench inputs file '{}', problem '{}'", path, pr.name);
    pr.layer = p["layer"] ? p["layer"].as<std::string>() : "";
    if (pr.layer != "column" && pr.layer != "row")
      throw_invalid("{}: layer must be column or row, got '{}'", w2, pr.layer);
    pr.m = positive(p, "m", w2);
    pr.k = positive(p, "k", w2);
    pr.n = positive(p, "n", w2);
    if (p["ops"]) {
      if (!p["ops"].IsSequence() || p["ops"].size() == 0)
        throw_invalid("{}: 'ops' must be a non-empty list, e.g. [all_reduce]", w2);
      for (const auto& o : p["ops"]) {
        const std::string op = o.as<std::string>();
        if (std::find(bench_ops().begin(), bench_ops().end(), op) == bench_ops().end())
          throw_invalid("{}: unknown op '{}'; use all_reduce, reduce_scatter or all_gather", w2, op);
        if (std::find(pr.ops.begin(), pr.ops.end(), op) != pr.ops.end())
          throw_invalid("{}: op '{}' is listed twice in 'ops'", w2, op);
        pr.ops.push_back(op);
      }
    } else if (pr.layer == "column") {
      pr.ops = {"all_gather"};
    } else {
      pr.ops = {"all_reduce", "reduce_scatter"};
    }
    if (m_scale != 1.0) {
      const int64_t scaled = static_cast<int64_t>(std::llround(static_cast<double>(pr.m) * m_scale));
      pr.m = std::max<int64_t>(run_tp, scaled / run_tp * run_tp);
    }
    const bool splits = std::any_of(pr.ops.begin(), pr.ops.end(), [](const std::string& o) { return o != "all_reduce"; });
    if (splits && pr.m % run_tp != 0)
      throw_invalid("{}: m={} is not divisible by the run's tp={} (reduce_scatter and all_gather give each rank m/tp "
                    "rows); use a multiple of {}",
                    w2, pr.m, run_tp, run_tp);
    f.problems.push_back(std::move(pr));
  }
  return f;
}

}  // namespace coc::cli::bench
