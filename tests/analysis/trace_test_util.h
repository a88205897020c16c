// Helpers of the trace-analysis tests: where the shared real traces are, and writing small synthetic traces.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace coc::test {

/// ../shared/traces/kineto/<name> (COC_SHARED_DIR is set by tests/CMakeLists.txt), or "" when absent.
inline std::string kineto_dir(const std::string& name) {
  const std::string dir = std::string(COC_SHARED_DIR) + "/traces/kineto/" + name;
  return std::filesystem::is_directory(dir) ? dir : std::string();
}

/// The single trace file in a kineto fixture folder.
inline std::string kineto_file(const std::string& name) {
  const std::string dir = kineto_dir(name);
  if (dir.empty()) return {};
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".gz") return e.path().string();
  return {};
}

#define COC_REQUIRE_SHARED(path)                                                                          \
  do {                                                                                                    \
    if ((path).empty())                                                                                   \
      GTEST_SKIP() << "shared traces not found under " COC_SHARED_DIR                                     \
                      "/traces (clone the `shared` folder next to the project to run this test)";         \
  } while (0)

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
