// Helpers of the trace-analysis tests: where the Kineto traces are (coc's synthetic fixtures, the shared real ones),
// and writing small synthetic traces.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

namespace coc::test {

/// A set of Kineto traces in folders named after the public traces they model (kineto/<name>/<file>.json.gz), with
/// the figures expected of them in the schema of shared/traces/hta_anchor_values.json:
///  - "synthetic": coc's own small fixtures in tests/analysis/data (data/README.md), present in every checkout;
///  - "shared": the real traces in the sibling checkout ../shared/traces (COC_SHARED_DIR, set by
///    tests/CMakeLists.txt), absent from a fresh clone: tests on them skip, saying so.
struct TraceSet {
  const char* label;
  std::string kineto_root;  ///< the folder holding <name>/
  std::string expected;     ///< the expected-figures JSON
  bool optional;            ///< absent folders skip (shared) rather than fail (synthetic)
};

inline TraceSet synthetic_traces() {
  return {"synthetic", COC_TEST_DATA_DIR "/kineto", COC_TEST_DATA_DIR "/kineto_expected.json", false};
}
inline TraceSet shared_traces() {
  return {"shared", COC_SHARED_DIR "/traces/kineto", COC_SHARED_DIR "/traces/hta_anchor_values.json", true};
}

/// GoogleTest prints a parameter through this (found by argument-dependent lookup): the set's label.
inline void PrintTo(const TraceSet& set, std::ostream* os) { *os << set.label; }

/// <set>/<name>, or "" when absent.
inline std::string kineto_dir(const TraceSet& set, const std::string& name) {
  const std::string dir = set.kineto_root + "/" + name;
  return std::filesystem::is_directory(dir) ? dir : std::string();
}

/// The single trace file of <set>/<name>, or "" when absent.
inline std::string kineto_file(const TraceSet& set, const std::string& name) {
  const std::string dir = kineto_dir(set, name);
  if (dir.empty()) return {};
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".gz") return e.path().string();
  return {};
}

/// Skips the test when an optional (shared) trace is absent; a missing synthetic fixture is a failure.
#define COC_REQUIRE_TRACE(set, path, name)                                                                  \
  do {                                                                                                    \
    if ((path).empty()) {                                                                                 \
      if ((set).optional)                                                                                 \
        GTEST_SKIP() << "shared traces not found under " << (set).kineto_root                             \
                     << " (clone the `shared` folder next to the project to run this test on them)";      \
      FAIL() << "synthetic fixture " << (name) << " missing under " << (set).kineto_root                  \
             << " (tests/analysis/data/make_kineto_fixtures.py writes it)";                               \
    }                                                                                                     \
  } while (0)

/// Names parametrised tests by their trace set ("synthetic", "shared").
struct TraceSetName {
  std::string operator()(const ::testing::TestParamInfo<TraceSet>& info) const { return info.param.label; }
};

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline void write_gz(const std::string& path, const std::string& text) {
  gzFile g = gzopen(path.c_str(), "wb");
  gzwrite(g, text.data(), static_cast<unsigned>(text.size()));
  gzclose(g);
}

}  // namespace coc::test
