// The outputs of `coc tune` (tune_report.h).
#include "cli/tune_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cctype>

#include "cli/output_file.h"
#include "coc/core/error.h"

namespace coc::cli {

using nlohmann::json;

namespace {
/// A YAML scalar: bare when it is a plain word or number, double-quoted otherwise (JSON of --customized-coc).
std::string yaml_scalar(const std::string& v) {
  const bool plain = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' || c == '-' || c == '+';
  });
  if (plain) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

/// An option's value as given: the flag's "true"/"false", or the option's words.
std::string option_value(const CLI::Option* opt) {
  const std::vector<std::string>& res = opt->results();
  if (opt->get_type_size() == 0) {  // a flag: the last occurrence wins, as in coc train
    const std::string last = res.empty() ? "true" : res.back();
    return last == "false" || last == "0" || last == "-1" ? "false" : "true";
  }
  // --coc-parallel-num's transform stores auto as 0 (CocOptions::kAuto), which the flag itself refuses.
  if (opt->check_lname("coc-parallel-num") && !res.empty() && res.back() == "0") return "auto";
  if (opt->get_expected_max() <= 1 && !res.empty()) return res.back();  // given twice: the last wins, as in coc train
  std::string v;
  for (const std::string& r : res) v += (v.empty() ? "" : " ") + r;
  return v;
}

std::string step_line(size_t i, const TuneStep& s) {
  if (s.status == "skipped" || s.status == "not tried")
    return fmt::format("  {:>2}  {:<44} {}: {}", i, s.cand.keys.empty() ? family_label(s.cand.family) : s.cand.label(),
                       s.status, s.reason);
  return fmt::format("  {:>2}  {:<44} {:8.1f} {:8.1f}  {:6.3f}  {:5.3f}  {:7.0f}  {} ({})", i,
                     s.cand.label() + (s.cand.whole_run ? " [whole runs]" : ""),
                     s.ms_before, s.ms_after, s.ratio, s.iqr, s.peak_mib, s.status, s.reason);
}

std::string chosen_label(const TuneResult& r) {
  if (r.chosen.empty()) return "the baseline (no switch kept)";
  Candidate c;
  c.keys = r.chosen;
  return c.label();
}

void print_report(const TuneOptions& o, const TuneResult& r) {
  std::printf("coc tune: %.0f s of a %g min budget; keep rule: median of the pairs' ratios best/candidate > 1 + "
              "max(0.02, IQR/2)\n",
              r.seconds, o.budget_minutes);
  if (r.baseline_ms > 0)
    std::printf("  baseline's first run: %.1f ms per iteration (each step and the confirmation compare within their "
                "own runs), peak RSS %.0f MiB per rank%s\n",
                r.baseline_ms,
                r.baseline_peak_mib, r.peak_reset ? "" : " (the process's mark: the kernel refused to reset it)");
  if (o.memory_limit_mib > 0 && r.baseline_peak_mib > o.memory_limit_mib)
    std::printf("  note: the baseline itself exceeds --memory-limit %.0f MiB\n", o.memory_limit_mib);
  if (!r.profile_line.empty()) std::printf("  %s\n", r.profile_line.c_str());
  std::printf("  %2s  %-44s %8s %8s  %6s  %5s  %7s  %s\n", "#", "switch", "ms best", "ms cand", "pairs", "IQR",
              "peakMiB", "result");
  for (size_t i = 0; i < r.steps.size(); ++i) std::printf("%s\n", step_line(i + 1, r.steps[i]).c_str());
  if (r.confirmed)
    std::printf("  confirmation against the baseline%s: %.1f -> %.1f ms, pairs %.3fx (IQR %.3f)%s\n",
                r.confirm_reused ? " (the one kept switch's own run, not repeated)" : "", r.confirm_ms_baseline, r.confirm_ms_tuned, r.confirm_ratio, r.confirm_iqr,
                r.returned_baseline ? ": the tuned configuration was slower, so the baseline is returned"
                : r.confirm_ratio < 1 ? ": slower, but the baseline exceeds --memory-limit, so the tuned configuration "
                                        "stands"
                                      : "");
  for (const std::string& line : verify_lines(r.verify)) std::printf("  %s\n", line.c_str());
  std::printf("  tuned: %s -> %s\n", chosen_label(r).c_str(), o.out.c_str());
  std::fflush(stdout);
}

json steps_json(const TuneResult& r) {
  json a = json::array();
  for (const TuneStep& s : r.steps) {
    json k = json::object();
    for (const auto& [key, v] : s.cand.keys) k[key] = v;
    a.push_back({{"family", s.cand.family}, {"communicator", s.cand.comm}, {"switch", s.cand.label()},
                 {"keys", k}, {"math_change", s.cand.math_change}, {"whole_runs", s.cand.whole_run}, {"status", s.status}, {"reason", s.reason},
                 {"ms_before", s.ms_before}, {"ms_after", s.ms_after}, {"pair_ratio_median", s.ratio},
                 {"pair_ratio_iqr", s.iqr}, {"threshold", s.threshold}, {"peak_rss_mib", s.peak_mib},
                 {"seconds", s.seconds}});
  }
  return a;
}
}  // namespace

std::string family_label(const std::string& f) {
  if (f == "layout") return "layout (tp, cp, pp, dp)";
  return f == "fsdp-prefetch" ? "--num-to-forward/backward-prefetch" : "--" + f;
}

std::vector<std::string> verify_lines(const json& v) {
  if (v.is_null()) return {};
  const std::string of = v.value("of", "tuned") == "baseline" ? "the baseline's profile (no switch kept)"
                                                                : "the tuned configuration's profile";
  if (v.contains("not_profiled")) return {"verify: not profiled (" + v["not_profiled"].get<std::string>() + ")"};
  const json& p = v["profile"];
  if (p.contains("error")) return {"verify: " + of + " not analysed (" + p["error"].get<std::string>() + ")"};
  std::vector<std::string> out;
  out.push_back(fmt::format("verify, {}: {} (healthy means exposed communication <= 10% and free < 3% on every "
                            "rank)",
                            of, p.value("healthy", false) ? "healthy" : "not healthy"));
  if (p.contains("verdict"))
    out.push_back(fmt::format("  exposed communication {:.1f}% on rank {}: {}", p["verdict"]["exposed_pct"].get<double>(),
                              p["verdict"]["rank"].get<int>(), p["verdict"]["exposed"].get<std::string>()));
  std::string still;
  for (const json& g : p.value("communicators", json::array()))
    if (g["exposed_ms"].get<double>() >= 0.05)  // what prints as 0.0 ms is not "still exposed"
      still += fmt::format("{}{} {:.1f} of {:.1f} ms", still.empty() ? "" : ", ", g["name"].get<std::string>(),
                           g["exposed_ms"].get<double>(), g["communication_ms"].get<double>());
  out.push_back("  still exposed, by communicator (summed over ranks): " + (still.empty() ? "nothing" : still));
  if (p.contains("host_bound"))
    out.push_back(fmt::format("  free {:.1f}% on rank {}: {}; host-bound evidence: {}",
                              p["host_bound"]["free_pct"].get<double>(), p["host_bound"]["rank"].get<int>(),
                              p["host_bound"]["free"].get<std::string>(),
                              p["host_bound"]["evidence"].get<std::string>()));
  return out;
}

std::string tuned_yaml(CLI::App* cmd, const TuneResult& r) {
  std::vector<std::pair<const CLI::Option*, std::pair<std::string, std::string>>> rows;
  for (const CLI::Option* opt : cmd->get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    // tune's own flags and --config (whose keys are written out one by one) are not coc train flags.
    if (opt->get_group() == kTuneGroup || name == "--test-keep" || name == "--config" || name == "--help") continue;
    rows.push_back({opt, {opt->get_lnames().front(), option_value(opt)}});
  }
  for (const auto& [key, value] : r.chosen) {
    const CLI::Option* opt = cmd->get_option("--" + key);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& row) { return row.first == opt; });
    if (it != rows.end()) it->second = {key, value};
    else rows.push_back({opt, {key, value}});
  }
  std::string y = "# Written by coc tune (docs/tune.md); load it with: coc train --config FILE\n";
  y += "# Kept: " + chosen_label(r) + "\n";
  for (const std::string& line : verify_lines(r.verify)) y += "# " + line + "\n";
  for (const auto& [opt, kv] : rows) y += kv.first + ": " + yaml_scalar(kv.second) + "\n";
  return y;
}

void write_outputs(CLI::App* cmd, const TuneOptions& o, const TuneResult& r, const json& env) {
  write_atomically(o.out, tuned_yaml(cmd, r));
  if (!o.report_html.empty()) write_atomically(o.report_html, tune_html(o, r));
  print_report(o, r);
  if (o.json.empty()) return;
  json chosen = json::object();
  for (const auto& [k, v] : r.chosen) chosen[k] = v;
  json j = {{"command", "tune"},
            {"budget_minutes", o.budget_minutes},
            {"memory_limit_mib", o.memory_limit_mib},
            {"allow_math_change", o.allow_math_change},
            {"tune_iters", o.tune_iters},
            {"skip_pairs", o.skip_pairs},
            {"keep_rule", "median(best/candidate pair ratios) > 1 + max(0.02, IQR/2)"},
            {"baseline_ms", r.baseline_ms},
            {"baseline_peak_rss_mib", r.baseline_peak_mib},
            {"layout", r.layout},
            {"profile", r.profile},
            {"verify", r.verify},
            {"order", json::array()},
            {"steps", steps_json(r)},
            {"chosen", chosen},
            {"confirmation", r.confirmed ? json{{"ms_baseline", r.confirm_ms_baseline},
                                                {"ms_tuned", r.confirm_ms_tuned},
                                                {"pair_ratio_median", r.confirm_ratio},
                                                {"pair_ratio_iqr", r.confirm_iqr},
                                                {"reused_step", r.confirm_reused},
                                                {"returned_baseline", r.returned_baseline}}
                                         : json(nullptr)},
            {"out", o.out},
            {"seconds", r.seconds},
            {"environment", env}};
  for (const auto& [family, comm] : r.order) j["order"].push_back(family);
  write_atomically(o.json, j.dump(2) + "\n");
}

}  // namespace coc::cli
