// A fresh folder under /tmp for a test, removed with everything in it at scope exit.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace coc::test {

struct TempDir {
  explicit TempDir(const std::string& prefix = "coc_test") {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
  std::string path;
};

}  // namespace coc::test
