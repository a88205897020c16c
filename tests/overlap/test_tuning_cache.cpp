// --coc-tuning-cache's file (include/coc/overlap/tuning_cache.h) without MPI: what an entry matches, that a stored
// choice replaces its own key only, the file round trip (temporary file + rename), and the one-line refusals of a
// corrupt file. tests/cli/tuning_cache.sh runs the cache end to end with real ranks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "coc/overlap/tuning_cache.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

using namespace coc;

namespace {

TuningEntry entry(int n = 4) {
  TuningEntry e;
  e.op = "matmul_reduce_scatter";
  e.m = 4096;
  e.k = 512;
  e.n = 1024;
  e.group_size = 2;
  e.link = "hosts a,b (ranks on hosts 0,1); btl ''; tcp if ''; engine inline";
  e.mpi_library = "Open MPI v4.1.4";
  e.coc_version = "0.1.0";
  e.parallel_num = n;
  e.algo = CocCommAlgo::kP2p;
  e.candidates_ms = {{"serial", 3.5}, {"N=4 p2p", 2.0}};
  return e;
}

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(TuningCache, AnEntryMatchesOnlyItsShapeModeDtypesGroupLinkLibraryAndVersion) {
  const TuningEntry a = entry();
  EXPECT_TRUE(a.matches(a));
  for (auto change : std::initializer_list<void (*)(TuningEntry&)>{
           [](TuningEntry& e) { e.m = 2048; }, [](TuningEntry& e) { e.k = 256; },
           [](TuningEntry& e) { e.n = 512; }, [](TuningEntry& e) { e.op = "matmul_all_reduce"; },
           [](TuningEntry& e) { e.deterministic = true; }, [](TuningEntry& e) { e.group_size = 4; },
           [](TuningEntry& e) { e.link = "hosts a (ranks on hosts 0,0)"; },
           [](TuningEntry& e) { e.mpi_library = "MPICH Version: 4.0.2"; },
           [](TuningEntry& e) { e.coc_version = "0.0.9"; }, [](TuningEntry& e) { e.gemm_dtype = "bf16"; },
           [](TuningEntry& e) { e.comm_dtype = "bf16"; }}) {
    TuningEntry b = a;
    change(b);
    EXPECT_FALSE(a.matches(b));
  }
  TuningEntry foreign = a;
  foreign.mpi_library = "MPICH Version: 4.0.2";
  EXPECT_TRUE(a.same_shape(foreign));  // a foreign entry: same shape, another setting
}

TEST(TuningCache, StoreReplacesItsKeyKeepsForeignEntriesAndRoundTrips) {
  test::TempDir d("tuning_cache");
  const std::string path = d / "cache.json";
  auto c = TuningCache::parse("", path, /*writer=*/true);
  TuningEntry foreign = entry(8);
  foreign.mpi_library = "MPICH Version: 4.0.2";
  c->store(foreign);
  c->store(entry(4));
  c->store(entry(16));  // re-timed: replaces the entry of the same key
  EXPECT_EQ(c->size(), 2u);
  ASSERT_TRUE(c->find(entry()).has_value());
  EXPECT_EQ(c->find(entry())->parallel_num, 16);
  EXPECT_TRUE(c->has_other_setting(entry()));
  c->save();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d.path), std::filesystem::directory_iterator()), 1)
      << "no temporary file is left";
  auto back = TuningCache::parse(read(path), path, false);
  EXPECT_EQ(back->size(), 2u);
  const auto hit = back->find(entry());
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->parallel_num, 16);
  EXPECT_EQ(hit->algo, CocCommAlgo::kP2p);
  ASSERT_EQ(hit->candidates_ms.size(), 2u);
  EXPECT_EQ(hit->candidates_ms[1].first, "N=4 p2p");
  EXPECT_EQ(back->find(foreign)->parallel_num, 8);
  // A reader that is not rank 0 never writes.
  back->store(entry(1));
  std::filesystem::remove(path);
  back->save();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TuningCache, AnEntryWithoutDtypesIsAnFp32OneAndBf16RoundTrips) {
  const std::string path = "old.json";
  const std::string old_entry = R"({"op": "matmul_reduce_scatter", "m": 4096, "k": 512, "n": 1024,
    "deterministic": false, "group_size": 2, "link": "hosts a,b (ranks on hosts 0,1); btl ''; tcp if ''; engine inline",
    "mpi_library": "Open MPI v4.1.4", "coc_version": "0.1.0", "parallel_num": 4, "comm_algo": "p2p"})";
  auto c = TuningCache::parse(R"({"format": "coc-tuning-cache", "version": 1, "entries": [)" + old_entry + "]}",
                              path, false);
  ASSERT_TRUE(c->find(entry()).has_value());
  TuningEntry bf16 = entry(8);
  bf16.gemm_dtype = bf16.comm_dtype = "bf16";
  EXPECT_FALSE(c->find(bf16).has_value()) << "a bf16 run times its own choice";
  test::TempDir d("tuning_cache_dtype");
  auto w = TuningCache::parse("", d / "cache.json", /*writer=*/true);
  w->store(bf16);
  w->save();
  auto back = TuningCache::parse(read(d / "cache.json"), d / "cache.json", false);
  ASSERT_TRUE(back->find(bf16).has_value());
  EXPECT_EQ(back->find(bf16)->comm_dtype, "bf16");
  EXPECT_FALSE(back->find(entry()).has_value());
}

TEST(TuningCache, ACorruptFileIsRefusedWithOneLine) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"format": "coc-tuning-cache", "version": 1, "entries": [)", "not JSON at byte"},
      {R"([1, 2])", "not a \"format\": \"coc-tuning-cache\" object"},
      {R"({"format": "coc-tuning-cache", "version": 7, "entries": []})", "file format version 7"},
      {R"({"format": "coc-tuning-cache", "version": 1})", "no \"entries\" array"},
      {R"({"format": "coc-tuning-cache", "version": 1, "entries": [3]})", "entry 0 is not an object"},
      {R"({"format": "coc-tuning-cache", "version": 1, "entries": [{"op": "x"}]})", "entry 0 has no integer \"m\""},
  };
  for (const auto& [text, want] : cases) {
    const Error e = test::expect_error([&] { TuningCache::parse(text, "/tmp/t.json", false); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_TRUE(e.uniform());
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--coc-tuning-cache /tmp/t.json: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_NE(msg.find("delete it"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // A bad choice inside an otherwise valid entry.
  const std::string bad =
      R"({"format": "coc-tuning-cache", "version": 1, "entries": [{"op": "matmul_all_reduce", "m": 1, "k": 1, "n": 1,
      "deterministic": false, "group_size": 2, "link": "l", "mpi_library": "x", "coc_version": "0.1.0",
      "parallel_num": 0, "comm_algo": "collective"}]})";
  const Error e = test::expect_error([&] { TuningCache::parse(bad, "/tmp/t.json", false); });
  EXPECT_NE(std::string(e.what()).find("entry 0 chooses parallel_num 0"), std::string::npos) << e.what();
}

}  // namespace
