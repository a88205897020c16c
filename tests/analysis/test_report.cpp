// The report renderers (src/analysis/report_*.cpp) on hand-built Reports: the CSV has msprof-analyze's
// step_trace_time.csv header and one row per rank and step, the JSON has its documented keys and survives bad
// UTF-8, the SVG and HTML are well-formed and escape event names, and the table shows verdicts, the "no device
// activity" row and the slow rank.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "coc/analysis/analyze.h"

namespace coc::analysis {
namespace {

StepReport step(const std::string& name, int64_t begin, int64_t window, int64_t computing, int64_t comm,
                int64_t overlapped) {
  StepReport s;
  s.name = name;
  s.begin_ns = begin;
  s.end_ns = begin + window;
  s.split.window = window;
  s.split.computing = computing;
  s.split.communication = comm;
  s.split.overlapped = overlapped;
  s.split.exposed = comm - overlapped;
  s.split.free = window - computing - s.split.exposed;
  s.kernels = 10;
  return s;
}

/// Rank 0: two steps (1 ms each; step 1 has 25% exposed communication, step 2 is healthy), lanes, kernels with
/// hostile names. Rank 1: a CPU-only trace.
Report sample() {
  Report r;
  RankReport a;
  a.rank = 0;
  a.file = "rank0.json.gz";
  a.format = TraceFormat::kKineto;
  a.has_device_activity = true;
  a.steps.push_back(step("ProfilerStep#7", 0, 1'000'000, 600'000, 400'000, 150'000));
  a.steps.push_back(step("ProfilerStep#8", 1'000'000, 1'000'000, 900'000, 200'000, 180'000));
  a.total = step("total", 0, 2'000'000, 1'500'000, 600'000, 330'000);
  a.lanes = {{0, 10'000, 600'000}, {1, 450'000, 850'000}, {2, 600'000, 850'000}, {3, 850'000, 1'000'000},
             {0, 1'000'000, 1'900'000}};
  a.top_kernels = {{"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication", 4, 600'000},
                   {"gemm<float, \"tn\"> & <bad>\x01", "compute", 12, 1'500'000}};
  a.malformed_events = 3;
  a.zero_ts_events = 2;
  a.notes = {"rank taken from the file name"};
  a.events = 100;
  a.device_events = 20;
  RankReport b;
  b.rank = 1;
  b.file = "cpu_only.json.gz";
  b.format = TraceFormat::kKineto;
  b.has_device_activity = false;
  b.total.name = "whole trace";
  b.events = 40;
  r.ranks = {a, b};
  r.top_kernels = a.top_kernels;
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(ReportCsv, HeaderFollowsMsprofStepTraceTime) {
  auto l = lines(render_csv(sample()));
  ASSERT_EQ(l.size(), 4u);  // header, two steps of rank 0, the whole-trace row of rank 1
  EXPECT_EQ(l[0],
            "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
            "Communication(Not Overlapped and Exclude Receive),Preparing");
  // Step 7: computing 600 µs, exposed 250, overlapped 150, comm 400, free 150, stage = window 1000, bubble 0,
  // exclude-receive = exposed, preparing = 10 µs before the first computing segment.
  EXPECT_EQ(l[1], "7,rank,0,600.000,250.000,150.000,400.000,150.000,1000.000,0.000,250.000,10.000");
  EXPECT_EQ(l[2].substr(0, 9), "8,rank,0,");
  EXPECT_EQ(l[3].substr(0, 8), ",rank,1,");
}

TEST(ReportJson, KeysAndUnits) {
  const std::string text = render_json(sample());
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["ranks"].size(), 2u);
  const auto& s = j["ranks"][0]["steps"][0];
  EXPECT_EQ(s["name"], "ProfilerStep#7");
  EXPECT_EQ(s["computing_ns"], 600'000);
  EXPECT_EQ(s["exposed_ns"], 250'000);
  EXPECT_DOUBLE_EQ(s["exposed_pct"].get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(s["overlap_pct"].get<double>(), 37.5);
  EXPECT_EQ(s["verdict"]["exposed"], "needs work");
  EXPECT_EQ(j["ranks"][1]["has_device_activity"], false);
  EXPECT_EQ(j["ranks"][0]["data_quality"]["malformed_events"], 3);
  EXPECT_TRUE(j.contains("convention"));
  EXPECT_TRUE(j["balance"].contains("slow_rank"));
  EXPECT_EQ(j["top_kernels"].size(), 2u);
}

TEST(ReportJson, InvalidUtf8InNamesIsReplacedNotThrown) {
  Report r = sample();
  r.ranks[0].top_kernels[0].name = "bad \xC3\x28 utf8";
  r.top_kernels = r.ranks[0].top_kernels;
  EXPECT_NO_THROW(nlohmann::json::parse(render_json(r)));
}

/// A small well-formedness check: tags balance and nest, attributes are quoted, and no bare '&' or '<' is left
/// in text. Enough to catch an unescaped event name or an unclosed element.
bool well_formed(const std::string& x, std::string* why) {
  std::vector<std::string> stack;
  size_t i = 0;
  while (i < x.size()) {
    if (x[i] == '&') {
      size_t semi = x.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return *why = "bare & at " + std::to_string(i), false;
      i = semi + 1;
      continue;
    }
    if (x[i] != '<') {
      ++i;
      continue;
    }
    if (x.compare(i, 2, "<!") == 0 || x.compare(i, 2, "<?") == 0) {
      i = x.find('>', i) + 1;
      continue;
    }
    size_t close = i + 1;
    bool in_quote = false;
    while (close < x.size() && (in_quote || x[close] != '>')) {
      if (x[close] == '"') in_quote = !in_quote;
      if (!in_quote && x[close] == '<') return *why = "'<' inside a tag at " + std::to_string(close), false;
      ++close;
    }
    if (close >= x.size()) return *why = "unclosed tag at " + std::to_string(i), false;
    std::string tag = x.substr(i + 1, close - i - 1);
    i = close + 1;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return *why = "mismatched </" + tag.substr(1) + ">", false;
      stack.pop_back();
    } else if (tag.back() != '/') {
      std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
      if (name != "meta") stack.push_back(name);  // HTML void element
    }
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  return true;
}

TEST(ReportSvg, WellFormedAndEscaped) {
  const std::string svg = render_svg(sample());
  std::string why;
  EXPECT_TRUE(well_formed(svg, &why)) << why;
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("Communication(Not Overlapped)"), std::string::npos);
  EXPECT_NE(svg.find("no device activity"), std::string::npos);
  EXPECT_EQ(svg.find('\x01'), std::string::npos);
}

TEST(ReportHtml, SelfContainedAndEscaped) {
  const std::string html = render_html(sample());
  std::string why;
  EXPECT_TRUE(well_formed(html.substr(html.find("<html")), &why)) << why;
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("gemm&lt;float, &quot;tn&quot;&gt; &amp; &lt;bad&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://", html.find("</svg>")), std::string::npos);  // nothing fetched from elsewhere
}

TEST(ReportTable, VerdictsNoDeviceRowAndNotes) {
  Report r = sample();
  const std::string t = render_table(r, /*color=*/false);
  EXPECT_NE(t.find("ProfilerStep#7"), std::string::npos);
  EXPECT_NE(t.find("needs work"), std::string::npos);
  EXPECT_NE(t.find("no device activity"), std::string::npos);
  EXPECT_NE(t.find("3 malformed event(s)"), std::string::npos);
  EXPECT_NE(t.find("2 event(s) at ts 0"), std::string::npos);
  EXPECT_NE(t.find("note: rank taken from the file name"), std::string::npos);
  EXPECT_NE(t.find("host-bound evidence"), std::string::npos);
  EXPECT_EQ(t.find("\033["), std::string::npos);  // no colour codes when asked for none
}

TEST(ReportTable, SlowRankIsNamed) {
  Report r = sample();
  RankReport c = r.ranks[0];
  c.rank = 2;
  c.steps[0].split.window = 1'200'000;
  c.steps[1].split.window = 1'200'000;
  r.ranks.push_back(c);
  r.slow_rank = true;
  r.slowest_rank = 2;
  r.fastest_rank = 0;
  const std::string t = render_table(r, false);
  EXPECT_NE(t.find("slow rank 2"), std::string::npos) << t;
  r.slow_rank = false;
  EXPECT_NE(render_table(r, false).find("balanced"), std::string::npos);
}

TEST(ReportAll, EmptyReportRendersWithoutThrowing) {
  Report r;
  EXPECT_NO_THROW(render_table(r, false));
  EXPECT_EQ(lines(render_csv(r)).size(), 1u);
  EXPECT_NO_THROW(nlohmann::json::parse(render_json(r)));
  std::string why;
  EXPECT_TRUE(well_formed(render_svg(r), &why)) << why;
}

}  // namespace
}  // namespace coc::analysis
