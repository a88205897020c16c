// Megatron's indexed dataset (.bin/.idx) written and read by coc, the training data built on it (prefixes, blends,
// splits, stateless sampling), the tokenizers' vocabulary padding, the safetensors header checks and its F32/BF16/F16
// writer. One process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "coc/core/error.h"
#include "coc/core/fp16.h"
#include "coc/model/dataset.h"
#include "coc/model/gpt_dataset.h"
#include "coc/model/indexed_dataset.h"
#include "coc/model/safetensors.h"
#include "coc/model/tokenizer.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace coc {
namespace {

using test::expect_error;

/// Documents of lengths 5, 0, 300, 17, ... with token ids i·7 + d mod 256.
std::vector<std::vector<int32_t>> make_docs(int n) {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(d == 1 ? 0 : (d * 131 + 5) % 400));
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((i * 7 + d) % 256);
    docs.push_back(doc);
  }
  return docs;
}

std::string build(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, IndexedDType dtype) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& d : docs) b.add_document(d.data(), static_cast<int64_t>(d.size()));
  b.finalize();
  return prefix;
}

TEST(IndexedDataset, RoundTripsEveryDocumentInEveryDtype) {
  test::TempDir dir("coc_test_idx");
  const auto docs = make_docs(40);
  for (IndexedDType dt : {IndexedDType::kUInt16, IndexedDType::kInt32}) {
    const std::string prefix = build(dir / ("c" + std::to_string(static_cast<int>(dt))), docs, dt);
    IndexedDataset ds(prefix);
    ASSERT_EQ(ds.num_sequences(), 40);
    ASSERT_EQ(ds.num_documents(), 40);
    EXPECT_EQ(ds.dtype(), dt);
    int64_t total = 0;
    for (int d = 0; d < 40; ++d) {
      ASSERT_EQ(ds.document_index(d), d);
      ASSERT_EQ(ds.sequence_length(d), static_cast<int64_t>(docs[static_cast<size_t>(d)].size()));
      std::vector<int32_t> got(docs[static_cast<size_t>(d)].size());
      ds.read_tokens(ds.token_offset(d), static_cast<int64_t>(got.size()), got.data());
      EXPECT_EQ(got, docs[static_cast<size_t>(d)]) << "document " << d;
      total += static_cast<int64_t>(got.size());
    }
    EXPECT_EQ(ds.document_index(40), 40);
    EXPECT_EQ(ds.num_tokens(), total);
  }
}

TEST(IndexedDataset, MissingAndCorruptIndexAreClearErrors) {
  test::TempDir dir("coc_test_idx");
  const std::string prefix = build(dir / "c", make_docs(10), IndexedDType::kUInt16);
  Error missing = expect_error([&] { IndexedDataset ds(dir / "nothing"); });
  EXPECT_EQ(missing.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(missing.what()).find("nothing.idx does not exist"), std::string::npos) << missing.what();

  std::vector<char> good;
  {
    std::ifstream f(prefix + ".idx", std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto write = [&](const std::vector<char>& bytes) {
    std::ofstream f(prefix + ".idx", std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  std::vector<char> bad = good;
  bad[0] = 'X';  // magic
  write(bad);
  Error e1 = expect_error([&] { IndexedDataset ds(prefix); });
  EXPECT_EQ(e1.kind(), ErrorKind::kCorrupt);
  EXPECT_NE(std::string(e1.what()).find("bad magic"), std::string::npos) << e1.what();
  write(std::vector<char>(good.begin(), good.end() - 8));  // truncated
  EXPECT_EQ(expect_error([&] { IndexedDataset ds(prefix); }).kind(), ErrorKind::kCorrupt);
  bad = good;
  const int64_t huge = int64_t{1} << 40;
  std::memcpy(bad.data() + 34 + 10 * 4, &huge, 8);  // sequence 0 points far outside .bin
  write(bad);
  Error e3 = expect_error([&] { IndexedDataset ds(prefix); });
  EXPECT_NE(std::string(e3.what()).find("points outside"), std::string::npos) << e3.what();
}

TEST(TrainingData, PrefixSamplesAreSlicesOfTheDocumentsAndTheSplitKeepsThemApart) {
  test::TempDir dir("coc_test_idx");
  const auto docs = make_docs(50);
  const std::string prefix = build(dir / "c_text_document", docs, IndexedDType::kUInt16);
  std::vector<int32_t> all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  auto tok = make_tokenizer("ByteTokenizer", "");
  // PREFIX_text_document is found from PREFIX too (Megatron's naming).
  TrainingData data(dir / "c", "80,20,0", *tok, 16);
  EXPECT_TRUE(data.has(Split::kTrain));
  EXPECT_TRUE(data.has(Split::kValid));
  EXPECT_FALSE(data.has(Split::kTest));
  IndexedDataset ds(prefix);
  const int64_t valid_begin = ds.token_offset(40);  // documents [40, 50) validate
  EXPECT_EQ(data.tokens(Split::kTrain), valid_begin);
  EXPECT_EQ(data.tokens(Split::kValid), static_cast<int64_t>(all.size()) - valid_begin);
  for (Split split : {Split::kTrain, Split::kValid})
    for (int it = 0; it < 5; ++it) {
      std::vector<int32_t> x, y;
      data.sample_batch(split, it, 1, 1, 2, 3, 16, 99, x, y);
      for (int b = 0; b < 3; ++b) {
        // Find the sample's start in the concatenated documents: tokens and targets are a contiguous slice.
        std::vector<int32_t> seq;
        for (int t = 0; t < 16; ++t) seq.push_back(x[static_cast<size_t>(t * 3 + b)]);
        seq.push_back(y[static_cast<size_t>(15 * 3 + b)]);
        bool found = false;
        const int64_t lo = split == Split::kTrain ? 0 : valid_begin;
        const int64_t hi = split == Split::kTrain ? valid_begin : static_cast<int64_t>(all.size());
        for (int64_t s = lo; s + 17 <= hi && !found; ++s) found = std::equal(seq.begin(), seq.end(), all.begin() + s);
        EXPECT_TRUE(found) << "sample " << b << " of iteration " << it << " is not inside its split";
        for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(y[static_cast<size_t>(t * 3 + b)], x[static_cast<size_t>((t + 1) * 3 + b)]);
      }
    }
  // Stateless: the same call gives the same batch.
  std::vector<int32_t> a, b, c, d;
  data.sample_batch(Split::kTrain, 7, 0, 0, 1, 4, 16, 5, a, b);
  data.sample_batch(Split::kTrain, 7, 0, 0, 1, 4, 16, 5, c, d);
  EXPECT_EQ(a, c);
  Error e = expect_error([&] { data.sample_batch(Split::kTest, 0, 0, 0, 1, 1, 16, 5, a, b); });
  EXPECT_NE(std::string(e.what()).find("--split"), std::string::npos) << e.what();
}

TEST(TrainingData, TokenIdsOutsideTheTokenizersVocabularyAreRefused) {
  test::TempDir dir("coc_test_idx");
  build(dir / "big", {std::vector<int32_t>(100, 300)}, IndexedDType::kUInt16);  // ids above the byte vocabulary
  auto tok = make_tokenizer("ByteTokenizer", "");
  TrainingData data(dir / "big", "", *tok, 8);
  std::vector<int32_t> x, y;
  Error e = expect_error([&] { data.sample_batch(Split::kTrain, 0, 0, 0, 1, 1, 8, 1, x, y); });
  EXPECT_NE(std::string(e.what()).find("holds token id 300 but the tokenizer's vocabulary has 256"), std::string::npos)
      << e.what();
}

TEST(TrainingData, TextWithoutSplitSamplesExactlyLikeByteDataset) {
  test::TempDir dir("coc_test_idx");
  {
    std::ofstream f(dir / "t.txt");
    for (int i = 0; i < 200; ++i) f << "line " << i << " of some text\n";
  }
  auto tok = make_tokenizer("ByteTokenizer", "");
  TrainingData data(dir / "t.txt", "", *tok, 32);
  ByteDataset bytes(dir / "t.txt", 32);
  for (int it = 0; it < 4; ++it) {
    std::vector<int32_t> a, b, c, d;
    data.sample_batch(Split::kTrain, it, 1, 0, 2, 4, 32, 1234, a, b);
    bytes.sample_batch(it, 1, 0, 2, 4, 32, 1234, c, d);
    EXPECT_EQ(a, c);
    EXPECT_EQ(b, d);
  }
}

TEST(TrainingData, BlendDrawsFromEverySourceByWeight) {
  test::TempDir dir("coc_test_idx");
  std::vector<std::vector<int32_t>> ones(20, std::vector<int32_t>(50, 1)), twos(20, std::vector<int32_t>(50, 2));
  build(dir / "a", ones, IndexedDType::kUInt16);
  build(dir / "b", twos, IndexedDType::kUInt16);
  auto tok = make_tokenizer("ByteTokenizer", "");
  TrainingData data("0.25 " + (dir / "a") + " 0.75 " + (dir / "b"), "", *tok, 8);
  int from_a = 0, n = 0;
  for (int it = 0; it < 50; ++it) {
    std::vector<int32_t> x, y;
    data.sample_batch(Split::kTrain, it, 0, 0, 1, 8, 8, 3, x, y);
    for (int b = 0; b < 8; ++b, ++n) from_a += x[static_cast<size_t>(b)] == 1;
  }
  EXPECT_NEAR(static_cast<double>(from_a) / n, 0.25, 0.07);
  Error e = expect_error([&] { TrainingData bad("0.3 " + (dir / "a") + " 0.7", "", *tok, 8); });
  EXPECT_NE(std::string(e.what()).find("has no path"), std::string::npos) << e.what();
}

TEST(TrainingData, SplitAndVocabularyPadding) {
  const auto f = parse_split("98,2,0");
  EXPECT_NEAR(f[0], 0.98, 1e-12);
  EXPECT_NEAR(f[1], 0.02, 1e-12);
  EXPECT_EQ(parse_split("")[0], 1.0);
  EXPECT_EQ(expect_error([] { parse_split("a,b"); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(expect_error([] { parse_split("0,0,0"); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(padded_vocab_size(256, 1, 3), 256);
  EXPECT_EQ(padded_vocab_size(1000, 128, 2), 1024);
  EXPECT_EQ(padded_vocab_size(32000, 128, 8), 32768);
  Error e = expect_error([] { padded_vocab_size(3, 1, 4); });
  EXPECT_NE(std::string(e.what()).find("cannot be split over --tensor-model-parallel-size 4"), std::string::npos);
  Error m = expect_error([] { make_tokenizer("SentencePieceTokenizer", "/no/such.model"); });
  EXPECT_NE(std::string(m.what()).find("--tokenizer-model /no/such.model: no such file"), std::string::npos);
}

TEST(Safetensors, HeaderChecksFollowTheFormat) {
  Tensor a({2, 3}), b({4});
  const std::string h = safetensors_header({{"a", &a}, {"b", &b}}, {{"k", "v"}});
  EXPECT_EQ((8 + h.size()) % 8, 0u);
  const SafetensorsHeader p = parse_safetensors_header(h, 8 + h.size() + 40);
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[1].begin, 24u);
  EXPECT_EQ(p.metadata.at("k"), "v");
  EXPECT_THROW(parse_safetensors_header(h, 8 + h.size() + 39), std::runtime_error);  // truncated
  EXPECT_THROW(parse_safetensors_header(h, 8 + h.size() + 41), std::runtime_error);  // trailing bytes
  EXPECT_THROW(parse_safetensors_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8 + 55 + 4),
               std::runtime_error);  // offsets do not match the shape
}

/// The raw data bytes of tensor `name` in the safetensors file at `path`.
std::vector<char> raw_tensor(const std::string& path, const SafetensorsHeader& h, const std::string& name) {
  const SafetensorsEntry* e = h.find(name);
  if (!e) return {};
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(h.data_offset() + e->begin));
  std::vector<char> out(e->end - e->begin);
  f.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

// `coc convert --hf-dtype`: the same fp32 tensors written as F32, BF16 and F16 hold exactly the round-to-nearest-even
// bits of dtype.h's scalar rules (ties, ±0, inf, NaN, a subnormal, fp16's overflow), and read back as those values.
TEST(Safetensors, WritesF32Bf16AndF16) {
  test::TempDir dir("coc_test_st");
  const float tie_even = 1.0f + 0x1p-8f, tie_up = 1.0f + 3 * 0x1p-8f;  // bf16 halfway cases: to 1 and to 1 + 2^-6
  const std::vector<float> v = {1.0f,     tie_even, tie_up,    -0.0f,      3.14159265f, 1e-40f,
                                70000.0f, -2.5e38f, INFINITY, -INFINITY, NAN,          0.1f};
  Tensor a({3, 4}), b({0});
  std::copy(v.begin(), v.end(), a.data());
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string path = dir / (std::string(to_string(t)) + ".safetensors");
    write_safetensors(path, {{"a", &a}, {"empty", &b}}, {{"format", "pt"}}, t);
    const SafetensorsHeader h = read_safetensors_header(path);
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.find("a")->dtype, safetensors_dtype_name(t));
    EXPECT_EQ(h.find("a")->end - h.find("a")->begin, 12u * static_cast<uint64_t>(dtype_size(t)));
    const std::vector<char> raw = raw_tensor(path, h, "a");
    Tensor back;
    read_safetensors_tensor(path, h, *h.find("a"), back);
    ASSERT_EQ(back.shape(), a.shape());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits32;
      std::memcpy(&bits32, &v[i], 4);
      uint16_t bits16 = 0;
      if (t != DType::kF32) std::memcpy(&bits16, raw.data() + 2 * i, 2);
      if (t == DType::kF32) EXPECT_EQ(std::memcmp(raw.data() + 4 * i, &bits32, 4), 0) << i;
      if (t == DType::kBF16) EXPECT_EQ(bits16, float_to_bf16(v[i]).bits) << i;
      if (t == DType::kF16) EXPECT_EQ(bits16, float_to_fp16(v[i])) << i;
      const float want = t == DType::kF32    ? v[i]
                         : t == DType::kBF16 ? bf16_to_float(float_to_bf16(v[i]))
                                             : fp16_to_float(float_to_fp16(v[i]));
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(back[static_cast<int64_t>(i)])) << i;
      else
        EXPECT_EQ(back[static_cast<int64_t>(i)], want) << i;
    }
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(tie_even)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(tie_up)), 1.0f + 0x1p-6f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(70000.0f)), INFINITY);
  Error e = expect_error([&] { write_safetensors(dir / "int8.safetensors", {{"a", &a}}, {}, DType::kInt8); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("cannot write safetensors tensors as int8"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "int8.safetensors"));
}

}  // namespace
}  // namespace coc
