// ByteDataset: which files a --data-path yields, the errors users see, and the sampling guarantees the trainer
// relies on (determinism across runs/resumes and a global batch independent of the data-parallel size).
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "coc/core/error.h"
#include "coc/model/dataset.h"

namespace fs = std::filesystem;
using coc::ByteDataset;
using coc::Error;
using coc::ErrorKind;

namespace {

struct TempDir : coc::test::TempDir {
  TempDir() : coc::test::TempDir("coc_test_dataset") {}
};

void write_file(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string as_string(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

using coc::test::expect_error;

std::string text_of(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + (i * 7 + i / 26) % 26));
  return s;
}

}  // namespace

TEST(ByteDataset, FolderSkipsDatBinaryEmptyAndDuplicateLinks) {
  TempDir d;
  write_file(d / "b", "second file\n");
  write_file(d / "a", "first file\n%\n");
  write_file(d / "a.dat", std::string("\0\0\0\2index", 10));         // fortune's strfile index: skipped by name
  write_file(d / "c.dat", "looks like text but is named .dat\n");   // skipped by name even if textual
  std::string bin = text_of(4000);
  bin[4095 - 1000] = 'x';
  bin += std::string("\0", 1);  // NUL at byte 4000 < 4096: binary
  write_file(d / "image.bin", bin);
  std::string late_nul = text_of(5000);
  late_nul[4500] = '\0';  // NUL only after the 4 KiB probe: treated as text (the documented heuristic)
  write_file(d / "sub/late", late_nul);
  write_file(d / "empty", "");
  write_file(d / "sub/deeper/z", "deep\n");
  fs::create_symlink("a", d / "a.u8");            // fortunes' .u8 aliases: same target, loaded once
  fs::create_symlink("../b", d / "sub/b_link");   // another alias, in a subfolder
  fs::create_symlink("..", d / "sub/loop");       // folder loop: must terminate
  fs::create_symlink("missing", d / "dangling");  // dangling link: ignored

  ByteDataset ds(d.path, 4);
  // Sorted byte-wise by full path; "a" wins over its alias "a.u8", "b" over "sub/b_link".
  std::vector<std::string> expect_files = {d / "a", d / "b", d / "sub/deeper/z", d / "sub/late"};
  EXPECT_EQ(ds.files(), expect_files);
  EXPECT_EQ(as_string(ds.bytes()), "first file\n%\nsecond file\ndeep\n" + late_nul);
  EXPECT_EQ(ds.size(), static_cast<int64_t>(ds.bytes().size()));
  const std::string desc = ds.description();
  EXPECT_NE(desc.find(d.path), std::string::npos) << desc;
  EXPECT_NE(desc.find("4 files"), std::string::npos) << desc;
  EXPECT_NE(desc.find(std::to_string(ds.size()) + " bytes"), std::string::npos) << desc;
  EXPECT_NE(desc.find("2 .dat"), std::string::npos) << desc;
  EXPECT_NE(desc.find("1 binary"), std::string::npos) << desc;
}

TEST(ByteDataset, SortsByFullPathNotByWalkOrder) {
  TempDir d;
  // Byte-wise, "x.txt" < "x/y" ('.' < '/'), although a per-folder walk would visit folder x first.
  write_file(d / "x/y", "Y");
  write_file(d / "x.txt", "T");
  write_file(d / "w", "W");
  ByteDataset ds(d.path, 1);
  EXPECT_EQ(as_string(ds.bytes()), "WTY");
}

TEST(ByteDataset, SingleFileAndChecksum) {
  TempDir d;
  write_file(d / "t.txt", "hello world\n");
  ByteDataset a(d / "t.txt", 5);
  EXPECT_EQ(as_string(a.bytes()), "hello world\n");
  EXPECT_EQ(a.files(), std::vector<std::string>{d / "t.txt"});
  ByteDataset b(d / "t.txt", 5);
  EXPECT_EQ(a.checksum(), b.checksum());
  write_file(d / "u.txt", "hello world!\n");
  EXPECT_NE(a.checksum(), ByteDataset(d / "u.txt", 5).checksum());
}

TEST(ByteDataset, MissingPathIsUniformErrorNamingTheFix) {
  Error e = expect_error([] { ByteDataset("/nonexistent/coc/data", 8); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(e.uniform());
  EXPECT_EQ(std::string(e.what()),
            "--data-path /nonexistent/coc/data does not exist; pass a text file or folder, or run scripts/setup to "
            "install the default fortunes corpus");
}

TEST(ByteDataset, FolderWithoutUsableTextIsAnError) {
  TempDir d;
  Error e = expect_error([&] { ByteDataset(d.path, 8); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(e.uniform());
  EXPECT_NE(std::string(e.what()).find("holds no usable text"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find(d.path), std::string::npos) << e.what();

  write_file(d / "x.dat", "idx");
  write_file(d / "bin", std::string("ab\0cd", 5));
  write_file(d / "empty", "");
  e = expect_error([&] { ByteDataset(d.path, 1); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("skipped 1 .dat index, 1 binary, 1 empty"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
}

TEST(ByteDataset, ExplicitEmptyOrBinaryFileIsAnError) {
  TempDir d;
  write_file(d / "empty.txt", "");
  write_file(d / "bin", std::string("ab\0cd", 5));
  Error e = expect_error([&] { ByteDataset(d / "empty.txt", 1); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("is empty"), std::string::npos) << e.what();
  e = expect_error([&] { ByteDataset(d / "bin", 1); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("binary"), std::string::npos) << e.what();
}

TEST(ByteDataset, TextShorterThanSeqLengthPlusOneIsAnError) {
  TempDir d;
  write_file(d / "t", "0123456789");  // 10 bytes
  EXPECT_NO_THROW(ByteDataset(d / "t", 9));  // exactly S + 1 bytes: one valid sample
  Error e = expect_error([&] { ByteDataset(d / "t", 10); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(e.uniform());
  EXPECT_EQ(std::string(e.what()),
            "--data-path " + (d / "t") + " holds 10 bytes of text but --seq-length 10 needs at least 11; pass more "
            "text or a smaller --seq-length");
  // The same check guards sample_batch for a dataset loaded with a shorter sequence length.
  ByteDataset ok(d / "t", 4);
  std::vector<int32_t> tok, tgt;
  e = expect_error([&] { ok.sample_batch(0, 0, 0, 1, 1, 10, 1, tok, tgt); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
}

TEST(ByteDataset, SampleLayoutIsSequenceMajorWithNextByteTargets) {
  TempDir d;
  write_file(d / "t", text_of(1000));
  ByteDataset ds(d / "t", 16);
  const int S = 16, B = 3, dp = 2, rank = 1, mb = 2;
  const uint64_t seed = 1234;
  std::vector<int32_t> tok, tgt;
  ds.sample_batch(7, mb, rank, dp, B, S, seed, tok, tgt);
  ASSERT_EQ(tok.size(), static_cast<size_t>(S * B));
  ASSERT_EQ(tgt.size(), static_cast<size_t>(S * B));
  for (int b = 0; b < B; ++b) {
    const int64_t g = (static_cast<int64_t>(mb) * dp + rank) * B + b;
    const int64_t off = ds.sample_offset(7, g, S, seed);
    ASSERT_GE(off, 0);
    ASSERT_LE(off, ds.size() - S - 1);
    for (int t = 0; t < S; ++t) {
      EXPECT_EQ(tok[t * B + b], ds.bytes()[off + t]) << "t=" << t << " b=" << b;
      EXPECT_EQ(tgt[t * B + b], ds.bytes()[off + t + 1]) << "t=" << t << " b=" << b;
    }
  }
}

TEST(ByteDataset, SamplingIsDeterministicAndResumable) {
  TempDir d;
  write_file(d / "t", text_of(5000));
  std::vector<int32_t> t1, y1, t2, y2;
  {
    ByteDataset run1(d / "t", 32);
    run1.sample_batch(100, 3, 1, 4, 2, 32, 42, t1, y1);
  }
  // A "resumed run": a new process would load the files again and ask for the same iteration directly,
  // without having drawn iterations 0..99 first.
  ByteDataset run2(d / "t", 32);
  run2.sample_batch(100, 3, 1, 4, 2, 32, 42, t2, y2);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(y1, y2);
  // Different iteration, seed or rank draw different data.
  run2.sample_batch(101, 3, 1, 4, 2, 32, 42, t2, y2);
  EXPECT_NE(t1, t2);
  run2.sample_batch(100, 3, 1, 4, 2, 32, 43, t2, y2);
  EXPECT_NE(t1, t2);
  run2.sample_batch(100, 3, 2, 4, 2, 32, 42, t2, y2);
  EXPECT_NE(t1, t2);
}

TEST(ByteDataset, GlobalBatchIsIndependentOfDataParallelSize) {
  TempDir d;
  write_file(d / "t", text_of(20000));
  ByteDataset ds(d / "t", 24);
  const int S = 24;
  const int G = 16;  // global batch (sequences per iteration)
  const uint64_t seed = 7;
  auto global_batch = [&](int dp, int B) {
    const int M = G / (dp * B);  // micro-batches per rank
    std::multiset<std::vector<int32_t>> seqs;
    std::vector<int32_t> tok, tgt;
    for (int r = 0; r < dp; ++r)
      for (int m = 0; m < M; ++m) {
        ds.sample_batch(5, m, r, dp, B, S, seed, tok, tgt);
        for (int b = 0; b < B; ++b) {
          std::vector<int32_t> seq;
          for (int t = 0; t < S; ++t) seq.push_back(tok[t * B + b]);
          seq.push_back(tgt[(S - 1) * B + b]);
          seqs.insert(seq);
        }
      }
    return seqs;
  };
  const auto reference = global_batch(1, 4);
  EXPECT_EQ(reference.size(), static_cast<size_t>(G));
  EXPECT_EQ(global_batch(2, 2), reference);
  EXPECT_EQ(global_batch(4, 1), reference);
  EXPECT_EQ(global_batch(4, 2), reference);
  EXPECT_EQ(global_batch(8, 2), reference);
  EXPECT_EQ(global_batch(16, 1), reference);
}

TEST(ByteDataset, OffsetsCoverEveryValidStart) {
  TempDir d;
  write_file(d / "t", text_of(50));
  ByteDataset ds(d / "t", 10);
  std::set<int64_t> seen;
  for (int64_t g = 0; g < 5000; ++g) {
    const int64_t off = ds.sample_offset(0, g, 10, 99);
    ASSERT_GE(off, 0);
    ASSERT_LE(off, 50 - 10 - 1);
    seen.insert(off);
  }
  EXPECT_EQ(seen.size(), 40u);  // starts 0..39 all drawn
  // With exactly S + 1 bytes the only valid start is 0.
  write_file(d / "u", text_of(11));
  ByteDataset tight(d / "u", 10);
  for (int64_t g = 0; g < 100; ++g) EXPECT_EQ(tight.sample_offset(3, g, 10, 5), 0);
}

TEST(ByteDataset, BadSamplingArgumentsAreUniformErrors) {
  TempDir d;
  write_file(d / "t", text_of(100));
  ByteDataset ds(d / "t", 8);
  std::vector<int32_t> tok, tgt;
  for (auto f : std::vector<std::function<void()>>{
           [&] { ds.sample_batch(-1, 0, 0, 1, 1, 8, 0, tok, tgt); },
           [&] { ds.sample_batch(0, -1, 0, 1, 1, 8, 0, tok, tgt); },
           [&] { ds.sample_batch(0, 0, 2, 2, 1, 8, 0, tok, tgt); },
           [&] { ds.sample_batch(0, 0, 0, 0, 1, 8, 0, tok, tgt); },
           [&] { ds.sample_batch(0, 0, 0, 1, 0, 8, 0, tok, tgt); },
           [&] { ds.sample_batch(0, 0, 0, 1, 1, 0, 0, tok, tgt); },
       }) {
    Error e = expect_error(f);
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_TRUE(e.uniform()) << e.what();
  }
}

TEST(ByteDataset, DefaultFortunesCorpus) {
  if (!fs::is_directory(coc::kDefaultDataPath)) GTEST_SKIP() << coc::kDefaultDataPath << " not installed";
  ByteDataset ds(coc::kDefaultDataPath, 256);
  EXPECT_GT(ds.size(), 100000);
  std::set<std::string> names;
  for (const std::string& f : ds.files()) {
    EXPECT_FALSE(f.ends_with(".dat")) << f;
    EXPECT_FALSE(f.ends_with(".u8")) << f << " duplicates its target";  // fortunes' .u8 files are symlinks
    names.insert(f);
  }
  EXPECT_EQ(names.size(), ds.files().size());
  for (uint8_t c : ds.bytes()) ASSERT_NE(c, 0);
}
