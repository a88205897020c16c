// Bad input to the trace readers: a one-line coc::Error naming the file and the byte offset, never a crash or a
// partial result passed off as complete.
#include <gtest/gtest.h>

#include <filesystem>

#include "coc/analysis/analyze.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "trace_test_util.h"

using namespace coc::analysis;

namespace {

std::string valid_trace() {
  std::string ev;
  for (int i = 0; i < 200; ++i) {
    if (i) ev += ",\n";
    ev += fmt::format(R"({{"ph": "X", "cat": "kernel", "name": "k{}", "pid": 0, "tid": 7, "ts": {}, "dur": 5, )"
                      R"("args": {{"stream": 7, "correlation": {}}}}})",
                      i, 1000 + 10 * i, i);
  }
  return "{\"traceEvents\": [\n" + ev + "\n], \"distributedInfo\": {\"rank\": 0}}\n";
}

std::string error_of(const std::string& path) {
  const coc::Error e = coc::test::expect_error([&] { analyze_file(path, {}); });
  EXPECT_EQ(e.kind(), coc::ErrorKind::kInvalidArgument);
  const std::string msg = e.what();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << "names the file: " << msg;
  return msg;
}

TEST(TraceBadInput, ValidFixtureParses) {
  coc::test::TempDir d("coc_bad");
  coc::test::write_file(d / "ok.json", valid_trace());
  EXPECT_EQ(analyze_file(d / "ok.json", {}).at(0).device_events, 200);
  coc::test::write_gz(d / "ok.json.gz", valid_trace());
  EXPECT_EQ(analyze_file(d / "ok.json.gz", {}).at(0).device_events, 200);
}

TEST(TraceBadInput, TruncatedJson) {
  coc::test::TempDir d("coc_bad");
  const std::string t = valid_trace();
  for (size_t cut : {t.size() / 2, t.size() - 3, size_t{20}}) {
    coc::test::write_file(d / "cut.json", t.substr(0, cut));
    const std::string msg = error_of(d / "cut.json");
    EXPECT_NE(msg.find("byte "), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected end of input"), std::string::npos) << msg;
  }
}

TEST(TraceBadInput, TruncatedGzip) {
  coc::test::TempDir d("coc_bad");
  coc::test::write_gz(d / "full.json.gz", valid_trace());
  const auto size = std::filesystem::file_size(d / "full.json.gz");
  std::filesystem::copy_file(d / "full.json.gz", d / "cut.json.gz");
  std::filesystem::resize_file(d / "cut.json.gz", size / 2);
  const std::string msg = error_of(d / "cut.json.gz");
  EXPECT_NE(msg.find("unexpected end of input"), std::string::npos) << msg;
}

TEST(TraceBadInput, WrongFormats) {
  coc::test::TempDir d("coc_bad");
  coc::test::write_file(d / "image.json", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  EXPECT_NE(error_of(d / "image.json").find("PNG"), std::string::npos);
  coc::test::write_file(d / "config.json", R"({"model": "llama", "layers": [1, 2, 3]})");
  EXPECT_NE(error_of(d / "config.json").find("traceEvents"), std::string::npos);
  coc::test::write_file(d / "numbers.json", "[1, 2, 3]");
  EXPECT_NE(error_of(d / "numbers.json").find("not a trace"), std::string::npos);
  coc::test::write_file(d / "empty.json", "");
  EXPECT_NE(error_of(d / "empty.json").find("empty"), std::string::npos);
  coc::test::write_file(d / "text.json", "hello");
  EXPECT_NE(error_of(d / "text.json").find("not a JSON trace"), std::string::npos);
  coc::test::write_file(d / "events_not_array.json", R"({"traceEvents": 5})");
  EXPECT_NE(error_of(d / "events_not_array.json").find("not an array"), std::string::npos);
}

TEST(TraceBadInput, UnreadablePaths) {
  coc::test::TempDir d("coc_bad");
  EXPECT_NE(error_of(d / "missing.json").find("cannot open"), std::string::npos);
  std::filesystem::create_directory(d / "dir.json");
  EXPECT_NE(error_of(d / "dir.json").find("directory"), std::string::npos);
  const coc::Error e = coc::test::expect_error([&] { analyze_paths({d.path}, {}); });
  EXPECT_NE(std::string(e.what()).find("no trace files"), std::string::npos) << e.what();
}

TEST(TraceBadInput, OneBadFileFailsTheWholeRun) {
  coc::test::TempDir d("coc_bad");
  coc::test::write_file(d / "rank0.json", valid_trace());
  coc::test::write_file(d / "rank1.json", valid_trace().substr(0, 500));
  const coc::Error e = coc::test::expect_error([&] { analyze_paths({d.path}, {}); });
  EXPECT_NE(std::string(e.what()).find("rank1.json"), std::string::npos) << e.what();
}

TEST(TraceBadInput, HostileNestingDoesNotCrash) {
  coc::test::TempDir d("coc_bad");
  std::string deep = "{\"traceEvents\": [{\"args\": ";
  for (int i = 0; i < 100000; ++i) deep += '[';
  coc::test::write_file(d / "deep.json", deep);
  error_of(d / "deep.json");
}

}  // namespace
