// Sharded checkpoints: bit-exact round trip, the Megatron-style layout, corruption detection (truncation, any
// flipped byte), atomic replacement, and the messages a user sees when a checkpoint does not fit the run.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coc/core/error.h"
#include "coc/model/checkpoint.h"

namespace fs = std::filesystem;
using coc::CheckpointShard;
using coc::Error;
using coc::ErrorKind;
using coc::Tensor;

namespace {

struct TempDir : coc::test::TempDir {
  TempDir() : coc::test::TempDir("coc_test_ckpt") {}
};

using coc::test::expect_error;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Random bit patterns, including NaNs with payloads, infinities, denormals and -0: a round trip must preserve
/// the bits, not just the values.
void fill_random_bits(Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t bits = rng();
    std::memcpy(&t[i], &bits, 4);
  }
  if (t.numel() >= 4) {
    t[0] = std::numeric_limits<float>::infinity();
    t[1] = -0.0f;
    t[2] = std::numeric_limits<float>::denorm_min();
    uint32_t nan = 0x7fc01234u;
    std::memcpy(&t[3], &nan, 4);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  // An empty tensor has no buffer: memcmp must not see its null pointer.
  return a.shape() == b.shape() &&
         (a.numel() == 0 || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * 4) == 0);
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A small model's shard: a TP-split weight, a replicated norm, a scalar and an empty tensor.
struct Model {
  Tensor w{{6, 5}}, norm{{5}}, step{std::vector<int64_t>{}}, empty{{0, 3}};
  CheckpointShard shard(int64_t iteration, int tp_rank = 1, int tp_size = 2) {
    CheckpointShard s;
    s.iteration = iteration;
    s.config_hash = 0xfeedface12345678ull;
    s.tp_rank = tp_rank;
    s.tp_size = tp_size;
    s.meta_json = R"({"seed":1234,"consumed_samples":800,"lr_step":100})";
    s.tensors = {{"layers.0.mlp.fc1.weight", &w}, {"layers.0.norm.weight", &norm}, {"adam.step", &step},
                 {"empty", &empty}};
    return s;
  }
};

Model random_model(uint32_t seed) {
  Model m;
  fill_random_bits(m.w, seed);
  fill_random_bits(m.norm, seed + 1);
  fill_random_bits(m.step, seed + 2);
  return m;
}

}  // namespace

TEST(Checkpoint, PathsFollowMegatronLayout) {
  EXPECT_EQ(coc::checkpoint_iteration_dir("/ck", 100), "/ck/iter_0000100");
  EXPECT_EQ(coc::checkpoint_shard_path("/ck", 100, 1, 0), "/ck/iter_0000100/mp_rank_01_dp_000.ckpt");
  EXPECT_EQ(coc::checkpoint_shard_path("/ck", 1234567, 12, 3), "/ck/iter_1234567/mp_rank_12_dp_003.ckpt");
}

// A pipelined checkpoint: which stage's shard holds each tensor (docs/pipeline.md, "Checkpoints").
TEST(Checkpoint, StageOfATensorFollowsThePipelineLayout) {
  const coc::PipelineLayout even{2, {2, 2}}, interleaved{2, {1, 1, 1, 1}}, split{3, {1, 2, 1}};
  EXPECT_EQ(coc::checkpoint_stage_of("embedding.weight", even), 0);
  EXPECT_EQ(coc::checkpoint_stage_of("embedding.weight.exp_avg", split), 0);
  EXPECT_EQ(coc::checkpoint_stage_of("final_layernorm.weight", split), 2);
  EXPECT_EQ(coc::checkpoint_stage_of("output_layer.weight.exp_avg_sq", even), 1);
  EXPECT_EQ(coc::checkpoint_stage_of("layers.1.attention.qkv.weight", even), 0);
  EXPECT_EQ(coc::checkpoint_stage_of("layers.2.mlp.down.weight.exp_avg", even), 1);
  // V = 2: virtual stage v lives in stage v mod P, so rank 0 holds layers 0 and 2.
  for (int layer = 0; layer < 4; ++layer)
    EXPECT_EQ(coc::checkpoint_stage_of("layers." + std::to_string(layer) + ".mlp.experts.down.weight", interleaved),
              layer % 2);
  EXPECT_EQ(coc::checkpoint_stage_of("layers.1.input_layernorm.weight", split), 1);
  EXPECT_EQ(coc::checkpoint_stage_of("layers.2.input_layernorm.weight", split), 1);
  EXPECT_EQ(coc::checkpoint_stage_of("layers.3.input_layernorm.weight", split), 2);
  EXPECT_EQ(coc::checkpoint_stage_field(1, 2, 1), 3);  // stage × ep + ep rank
  // The layout coc train records in the meta, and {1, {layers}} without one.
  EXPECT_EQ(coc::checkpoint_pipeline_layout(R"({"mesh":{"pp":2,"pp_layers":[1,1,1,1]}})", 4), interleaved);
  EXPECT_EQ(coc::checkpoint_pipeline_layout(R"({"mesh":{"tp":2}})", 4), (coc::PipelineLayout{1, {4}}));
  EXPECT_EQ(coc::checkpoint_pipeline_layout("not json", 6), (coc::PipelineLayout{1, {6}}));
}

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir d;
  Model saved = random_model(1);
  coc::save_shard(d.path, saved.shard(100));
  const std::string path = d.path + "/iter_0000100/mp_rank_01_dp_000.ckpt";
  ASSERT_TRUE(fs::exists(path));

  Model loaded;  // zeros, right shapes
  loaded.w.fill(-1.0f);
  CheckpointShard into = loaded.shard(0);
  into.meta_json.clear();
  coc::load_shard(d.path, 100, into);
  EXPECT_EQ(into.iteration, 100);
  EXPECT_EQ(into.meta_json, R"({"seed":1234,"consumed_samples":800,"lr_step":100})");
  EXPECT_TRUE(same_bits(loaded.w, saved.w));
  EXPECT_TRUE(same_bits(loaded.norm, saved.norm));
  EXPECT_TRUE(same_bits(loaded.step, saved.step));
  EXPECT_TRUE(same_bits(loaded.empty, saved.empty));

  // Nothing but the final file in the folder: no temporary file survives a successful save.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.path + "/iter_0000100")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"mp_rank_01_dp_000.ckpt"});
}

TEST(Checkpoint, ShardIsASafetensorsFileWithCocFieldsInItsMetadata) {
  TempDir d;
  Model m = random_model(2);
  coc::save_shard(d.path, m.shard(5));
  std::vector<char> bytes = read_bytes(coc::checkpoint_shard_path(d.path, 5, 1, 0));
  ASSERT_GT(bytes.size(), 8u);
  // The safetensors layout, read from its description: u64 header length, JSON header, data.
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the data starts 8-byte aligned";
  const auto h = nlohmann::json::parse(std::string(bytes.data() + 8, n));
  const auto& meta = h.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "coc");
  EXPECT_EQ(meta.at("iteration"), "5");
  EXPECT_EQ(meta.at("tp_rank"), "1");
  EXPECT_EQ(meta.at("tp_size"), "2");
  EXPECT_EQ(meta.at("meta"), R"({"seed":1234,"consumed_samples":800,"lr_step":100})");
  EXPECT_EQ(meta.at("coc_crc32").get<std::string>().size(), 8u);
  const auto& w = h.at("layers.0.mlp.fc1.weight");
  EXPECT_EQ(w.at("dtype"), "F32");
  EXPECT_EQ(w.at("shape"), nlohmann::json::array({6, 5}));
  const uint64_t begin = w.at("data_offsets")[0], end = w.at("data_offsets")[1];
  EXPECT_EQ(end - begin, 30u * 4);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + begin, m.w.data(), 30 * 4), 0);
  EXPECT_EQ(h.at("adam.step").at("shape"), nlohmann::json::array());
  EXPECT_EQ(bytes.size(), 8 + n + static_cast<size_t>(6 * 5 + 5 + 1 + 0) * 4) << "the file ends with the data";
}

/// The format before safetensors: "COCCKPT1", u32 version 1, u32 header length, JSON header, zero padding to 64,
/// fp32 data, u32 CRC32 of everything before it.
void write_legacy_shard(const std::string& path, Model& m, int64_t iteration) {
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t off = 0;
  std::vector<std::pair<std::string, Tensor*>> ts = m.shard(iteration).tensors;
  for (auto& [name, t] : ts) {
    const uint64_t bytes = static_cast<uint64_t>(t->numel()) * 4;
    tensors.push_back({{"name", name}, {"dtype", "f32"}, {"shape", t->shape()}, {"offset", off}, {"bytes", bytes}});
    off += bytes;
  }
  const CheckpointShard s = m.shard(iteration);
  const std::string header = nlohmann::json{{"iteration", iteration}, {"config_hash", s.config_hash},
                                            {"tp_rank", 1}, {"tp_size", 2}, {"dp_rank", 0}, {"meta", s.meta_json},
                                            {"data_bytes", off}, {"tensors", tensors}}.dump();
  std::vector<char> out = {'C', 'O', 'C', 'C', 'K', 'P', 'T', '1'};
  const uint32_t version = 1, hb = static_cast<uint32_t>(header.size());
  out.insert(out.end(), reinterpret_cast<const char*>(&version), reinterpret_cast<const char*>(&version) + 4);
  out.insert(out.end(), reinterpret_cast<const char*>(&hb), reinterpret_cast<const char*>(&hb) + 4);
  out.insert(out.end(), header.begin(), header.end());
  out.resize((out.size() + 63) / 64 * 64, 0);
  for (auto& [name, t] : ts)
    out.insert(out.end(), reinterpret_cast<const char*>(t->data()), reinterpret_cast<const char*>(t->data() + t->numel()));
  const uint32_t crc = static_cast<uint32_t>(
      ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size())));
  out.insert(out.end(), reinterpret_cast<const char*>(&crc), reinterpret_cast<const char*>(&crc) + 4);
  fs::create_directories(fs::path(path).parent_path());
  write_bytes(path, out);
}

TEST(Checkpoint, OldFormatStillLoads) {
  TempDir d;
  Model saved = random_model(9);
  write_legacy_shard(coc::checkpoint_shard_path(d.path, 7, 1, 0), saved, 7);
  Model loaded;
  CheckpointShard into = loaded.shard(0);
  coc::load_shard(d.path, 7, into);
  EXPECT_EQ(into.iteration, 7);
  EXPECT_TRUE(same_bits(loaded.w, saved.w));
  EXPECT_TRUE(same_bits(loaded.step, saved.step));
}

TEST(Checkpoint, LatestIterationFile) {
  TempDir d;
  EXPECT_EQ(coc::read_latest(d.path), std::nullopt);
  EXPECT_EQ(coc::read_latest(d.path + "/not/there"), std::nullopt);
  coc::write_latest(d.path, 100);
  EXPECT_EQ(coc::read_latest(d.path), 100);
  coc::write_latest(d.path, 200);
  EXPECT_EQ(coc::read_latest(d.path), 200);
  const std::string file = d.path + "/latest_checkpointed_iteration.txt";
  std::vector<char> text = read_bytes(file);
  EXPECT_EQ(std::string(text.begin(), text.end()), "200\n");
  // Megatron writes the number without a newline.
  write_bytes(file, {'3', '0', '0'});
  EXPECT_EQ(coc::read_latest(d.path), 300);
  for (std::string bad : {"", "release", "12abc", "-5", "\n"}) {
    write_bytes(file, std::vector<char>(bad.begin(), bad.end()));
    Error e = expect_error([&] { coc::read_latest(d.path); });
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << bad;
    EXPECT_TRUE(contains(e.what(), file)) << e.what();
  }
  int n = 0;
  for (const auto& e : fs::directory_iterator(d.path)) n += contains(e.path().filename(), ".tmp.");
  EXPECT_EQ(n, 0);
}

TEST(Checkpoint, TruncatedFileIsCorruptAndNamesThePath) {
  TempDir d;
  Model m = random_model(3);
  coc::save_shard(d.path, m.shard(10));
  const std::string path = coc::checkpoint_shard_path(d.path, 10, 1, 0);
  const std::vector<char> good = read_bytes(path);
  for (size_t cut : {size_t{0}, size_t{7}, size_t{16}, size_t{40}, good.size() / 2, good.size() - 5,
                     good.size() - 1}) {
    write_bytes(path, std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
    Model loaded;
    CheckpointShard into = loaded.shard(0);
    Error e = expect_error([&] { coc::load_shard(d.path, 10, into); });
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << "cut at " << cut << ": " << e.what();
    EXPECT_TRUE(contains(e.what(), "checkpoint " + path + " is corrupt (")) << e.what();
    EXPECT_TRUE(contains(e.what(), "truncated at byte " + std::to_string(cut))) << e.what();
    EXPECT_TRUE(contains(e.what(), "latest_checkpointed_iteration.txt")) << "names the fix: " << e.what();
    EXPECT_FALSE(contains(e.what(), "\n")) << e.what();
  }
  // Extra bytes are corruption too (e.g. two writers appending).
  std::vector<char> longer = good;
  longer.push_back('x');
  write_bytes(path, longer);
  Model loaded;
  CheckpointShard into = loaded.shard(0);
  EXPECT_EQ(expect_error([&] { coc::load_shard(d.path, 10, into); }).kind(), ErrorKind::kCorrupt);
}

TEST(Checkpoint, EveryFlippedByteIsDetectedAndLeavesTensorsUntouched) {
  TempDir d;
  Model m = random_model(4);
  coc::save_shard(d.path, m.shard(20));
  const std::string path = coc::checkpoint_shard_path(d.path, 20, 1, 0);
  const std::vector<char> good = read_bytes(path);
  Model loaded;
  loaded.w.fill(3.5f);
  loaded.norm.fill(4.5f);
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<char> bad = good;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    write_bytes(path, bad);
    CheckpointShard into = loaded.shard(0);
    Error e = expect_error([&] { coc::load_shard(d.path, 20, into); });
    ASSERT_EQ(e.kind(), ErrorKind::kCorrupt) << "byte " << i << ": " << e.what();
    ASSERT_TRUE(contains(e.what(), "checkpoint " + path)) << e.what();
    ASSERT_EQ(loaded.w[7], 3.5f) << "a failed load must not modify the tensors (byte " << i << ")";
    ASSERT_EQ(loaded.norm[4], 4.5f);
  }
  // A flip in the tensor data reads as a CRC mismatch.
  std::vector<char> bad = good;
  bad[good.size() - 20] ^= 1;
  write_bytes(path, bad);
  CheckpointShard into = loaded.shard(0);
  Error e = expect_error([&] { coc::load_shard(d.path, 20, into); });
  EXPECT_TRUE(contains(e.what(), "is corrupt (CRC mismatch")) << e.what();
}

TEST(Checkpoint, LeftoverTempFilesAreIgnored) {
  TempDir d;
  Model m = random_model(5);
  coc::save_shard(d.path, m.shard(30));
  coc::write_latest(d.path, 30);
  // What a save killed mid-write leaves behind: partial temporaries next to the real files.
  const std::string shard = coc::checkpoint_shard_path(d.path, 30, 1, 0);
  write_bytes(shard + ".tmp.99999", {'C', 'O', 'C', 'C', 'K', 'P', 'T', '1', 0, 0});
  write_bytes(d.path + "/latest_checkpointed_iteration.txt.tmp.99999", {'4', '0'});
  fs::create_directories(coc::checkpoint_iteration_dir(d.path, 40));
  write_bytes(coc::checkpoint_shard_path(d.path, 40, 1, 0) + ".tmp.4242", {'x'});

  EXPECT_EQ(coc::read_latest(d.path), 30);
  Model loaded;
  CheckpointShard into = loaded.shard(0);
  coc::load_shard(d.path, 30, into);
  EXPECT_TRUE(same_bits(loaded.w, m.w));
  // The crashed iteration has no final file: a clear "does not exist", not an attempt to read the temporary.
  Error e = expect_error([&] { coc::load_shard(d.path, 40, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_TRUE(contains(e.what(), coc::checkpoint_shard_path(d.path, 40, 1, 0) + " does not exist")) << e.what();
}

TEST(Checkpoint, ReplacementIsAtomicForConcurrentReaders) {
  // A writer replaces the same shard several times with ~16 MB files while a reader keeps loading it. Every
  // load must either find no file yet or a complete, CRC-valid one whose data is all from one save.
  TempDir d;
  constexpr int kVersions = 6;
  constexpr int64_t kRows = 1024, kCols = 4096;
  Tensor big({kRows, kCols});
  std::atomic<bool> done{false};
  std::atomic<int> saved{0};
  std::thread writer([&] {
    Tensor w({kRows, kCols});
    for (int v = 1; v <= kVersions; ++v) {
      w.fill(static_cast<float>(v));
      CheckpointShard s;
      s.iteration = 50;
      s.tp_rank = 0;
      s.tp_size = 1;
      s.tensors = {{"w", &w}};
      coc::save_shard(d.path, s);
      saved = v;
    }
    done = true;
  });
  const std::string path = coc::checkpoint_shard_path(d.path, 50, 0, 0);
  int complete_loads = 0;
  std::string failure;
  while (!done || complete_loads == 0) {
    // Read the counter before looking: a save that completed before exists() must be visible to it.
    const int saved_before = saved;
    if (!fs::exists(path)) {
      if (saved_before > 0) failure = "final file vanished after a save";
      if (done) break;
      continue;
    }
    CheckpointShard s;
    s.tp_size = 1;
    s.tensors = {{"w", &big}};
    try {
      coc::load_shard(d.path, 50, s);
    } catch (const Error& e) {
      failure = e.what();
      break;
    }
    const float v = big[0];
    if (v < 1 || v > kVersions || big[kRows * kCols - 1] != v || big[kRows * kCols / 2] != v)
      failure = "mixed or invalid data";
    ++complete_loads;
  }
  writer.join();
  EXPECT_EQ(failure, "");
  EXPECT_GT(complete_loads, 0);
  CheckpointShard s;
  s.tp_size = 1;
  s.tensors = {{"w", &big}};
  coc::load_shard(d.path, 50, s);
  EXPECT_EQ(big[12345], static_cast<float>(kVersions));
  int tmp = 0;
  for (const auto& e : fs::directory_iterator(coc::checkpoint_iteration_dir(d.path, 50)))
    tmp += contains(e.path().filename(), ".tmp.");
  EXPECT_EQ(tmp, 0);
}

TEST(Checkpoint, FailedSaveLeavesNoFileAndIsAnIoError) {
  TempDir d;
  // A --save path under a regular file cannot be created.
  write_bytes(d.path + "/afile", {'x'});
  Model m = random_model(6);
  Error e = expect_error([&] { coc::save_shard(d.path + "/afile/ck", m.shard(1)); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_FALSE(e.uniform());
  EXPECT_TRUE(contains(e.what(), d.path + "/afile/ck")) << e.what();
  e = expect_error([&] { coc::write_latest(d.path + "/afile", 1); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);

  // The shard file's name taken by a folder: the temporary is written, the rename fails, the temporary is
  // removed and the folder is untouched.
  const std::string path = coc::checkpoint_shard_path(d.path, 2, 1, 0);
  fs::create_directories(path);
  e = expect_error([&] { coc::save_shard(d.path, m.shard(2)); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_TRUE(fs::is_directory(path));
  int entries = 0;
  for ([[maybe_unused]] const auto& x : fs::directory_iterator(coc::checkpoint_iteration_dir(d.path, 2))) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Checkpoint, ShapeMismatchNamesTensorShapesAndFix) {
  TempDir d;
  Model m = random_model(7);
  coc::save_shard(d.path, m.shard(60));
  Model other;
  other.w.resize({12, 5});  // e.g. a different --ffn-hidden-size
  CheckpointShard into = other.shard(0);
  Error e = expect_error([&] { coc::load_shard(d.path, 60, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_FALSE(e.uniform());
  const std::string msg = e.what();
  EXPECT_TRUE(contains(msg, coc::checkpoint_shard_path(d.path, 60, 1, 0))) << msg;
  EXPECT_TRUE(contains(msg, "'layers.0.mlp.fc1.weight' has shape [6, 5] in the checkpoint but this run expects "
                            "[12, 5]")) << msg;
  EXPECT_TRUE(contains(msg, "--tensor-model-parallel-size 2")) << msg;
  EXPECT_EQ(other.norm[0], 0.0f) << "nothing loaded on a mismatch";
}

TEST(Checkpoint, RunMismatchMessages) {
  TempDir d;
  Model m0 = random_model(8), m1 = random_model(9);
  coc::save_shard(d.path, m0.shard(70, 0, 2));
  coc::save_shard(d.path, m1.shard(70, 1, 2));

  // Resumed with tp 4: ranks 0/1 find files saved for tp 2, ranks 2/3 find none.
  Model l;
  CheckpointShard into = l.shard(0, 1, 4);
  Error e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "was saved with --tensor-model-parallel-size 2 but this run uses 4")) << e.what();
  into = l.shard(0, 3, 4);
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "holds shards of TP ranks [0, 1]")) << e.what();

  // Different model config.
  into = l.shard(0, 0, 2);
  into.config_hash = 1;
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "different model config")) << e.what();
  EXPECT_TRUE(contains(e.what(), "consumed_samples")) << "shows what it was saved with: " << e.what();
  into.meta_json = R"({"model":"--num-layers 9"})";
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_TRUE(contains(e.what(), "this run: --num-layers 9)")) << e.what();

  // A tensor this run expects but the file lacks, and the reverse.
  Tensor extra({2});
  into = l.shard(0, 0, 2);
  into.tensors.push_back({"adam.m.new", &extra});
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "has no tensor 'adam.m.new'")) << e.what();
  into = l.shard(0, 0, 2);
  into.tensors.pop_back();
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "holds tensor 'empty' [0, 3] that this run does not expect")) << e.what();
  // A partial load (a pipeline stage reading its layers from another layout's shard) skips what it does not name.
  into.partial = true;
  EXPECT_NO_THROW(coc::load_shard(d.path, 70, into));

  // A missing iteration folder.
  into = l.shard(0, 0, 2);
  e = expect_error([&] { coc::load_shard(d.path, 71, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
  EXPECT_TRUE(contains(e.what(), "iter_0000071 does not exist")) << e.what();

  // A shard copied under another rank's name is caught by its header.
  fs::copy_file(coc::checkpoint_shard_path(d.path, 70, 0, 0), coc::checkpoint_shard_path(d.path, 70, 1, 0),
                fs::copy_options::overwrite_existing);
  into = l.shard(0, 1, 2);
  e = expect_error([&] { coc::load_shard(d.path, 70, into); });
  EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
}

TEST(Checkpoint, MalformedShardIsRejectedBeforeWriting) {
  TempDir d;
  Model m = random_model(10);
  CheckpointShard s = m.shard(1);
  s.tensors.push_back({"adam.step", &m.step});
  EXPECT_EQ(expect_error([&] { coc::save_shard(d.path, s); }).kind(), ErrorKind::kInvalidArgument);
  s = m.shard(1);
  s.tp_rank = 2;
  EXPECT_EQ(expect_error([&] { coc::save_shard(d.path, s); }).kind(), ErrorKind::kInvalidArgument);
  s = m.shard(-1);
  EXPECT_EQ(expect_error([&] { coc::save_shard(d.path, s); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(d.path));
}
