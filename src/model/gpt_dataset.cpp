#include "coc/model/gpt_dataset.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "coc/core/error.h"
#include "coc/core/splitmix.h"
#include "coc/model/dataset.h"
#include "coc/model/indexed_dataset.h"

namespace coc {
namespace {

namespace fs = std::filesystem;

/// The seed of each split's draws: the training split keeps the run's seed (ByteDataset's samples, bit for bit).
uint64_t split_seed(uint64_t seed, Split s) {
  return s == Split::kTrain ? seed : splitmix64(seed ^ (0x73706c6974ULL + static_cast<uint64_t>(s)));
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

/// Megatron's get_split_indices: part boundaries of `size` items at the rounded cumulative fractions, the last at
/// `size`.
std::array<int64_t, 4> split_bounds(const std::array<double, 3>& f, int64_t size) {
  std::array<int64_t, 4> b{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) b[i + 1] = b[i] + static_cast<int64_t>(std::llround(f[i] * static_cast<double>(size)));
  const int64_t diff = b[3] - size;
  for (int i = 1; i < 4; ++i) b[i] -= diff;
  for (int i = 1; i < 4; ++i) b[i] = std::max(b[i], b[i - 1]);
  return b;
}

}  // namespace

std::array<double, 3> parse_split(const std::string& split) {
  std::array<double, 3> f{1, 0, 0};
  if (split.empty()) return f;
  std::string s = split;
  for (char& c : s)
    if (c == '/') c = ',';
  std::vector<double> parts;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!is_number(item) || std::stod(item) < 0)
      throw_invalid("--split '{}': '{}' is not a non-negative number; pass train,valid,test weights such as 98,2,0",
                    split, item);
    parts.push_back(std::stod(item));
  }
  if (parts.empty() || parts.size() > 3)
    throw_invalid("--split '{}' needs one to three weights (train,valid,test), e.g. 98,2,0", split);
  parts.resize(3, 0.0);
  const double sum = parts[0] + parts[1] + parts[2];
  if (!(sum > 0)) throw_invalid("--split '{}' sums to 0; give the training part a weight, e.g. 98,2,0", split);
  for (int i = 0; i < 3; ++i) f[i] = parts[i] / sum;
  return f;
}

/// One source of a blend: the token stream and each split's [begin, end) range of it.
struct TrainingData::Source {
  std::string name;
  double weight = 1;
  std::unique_ptr<ByteDataset> text;      ///< text, with bytes as tokens when `ids` is empty
  std::vector<int32_t> ids;               ///< text tokenized by a non-byte tokenizer
  std::unique_ptr<IndexedDataset> indexed;
  std::array<std::pair<int64_t, int64_t>, 3> range{};

  int64_t size() const {
    if (indexed) return indexed->num_tokens();
    return ids.empty() ? text->size() : static_cast<int64_t>(ids.size());
  }
  int64_t part(Split s) const { return range[static_cast<int>(s)].second - range[static_cast<int>(s)].first; }
  void read(int64_t offset, int64_t n, int32_t* out) const {
    if (indexed) return indexed->read_tokens(offset, n, out);
    if (!ids.empty()) {
      std::copy(ids.begin() + offset, ids.begin() + offset + n, out);
      return;
    }
    const uint8_t* b = text->bytes().data() + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = b[i];
  }
};

TrainingData::~TrainingData() = default;

TrainingData::TrainingData(const std::string& data_path, const std::string& split, const Tokenizer& tokenizer,
                           int64_t seq_length)
    : seq_length_(seq_length), vocab_size_(tokenizer.vocab_size()) {
  const std::array<double, 3> fractions = parse_split(split);
  // A blend is "W1 P1 W2 P2 ...": an even number of words whose odd ones are numbers. Anything else is one path
  // (paths may contain spaces).
  std::vector<std::string> words;
  {
    std::stringstream in(data_path);
    for (std::string w; in >> w;) words.push_back(w);
  }
  std::vector<std::pair<double, std::string>> entries;
  if (words.size() >= 2 && is_number(words[0])) {
    if (words.size() % 2 != 0)
      throw_invalid("--data-path '{}': a blend is 'WEIGHT PREFIX WEIGHT PREFIX ...' but weight {} has no path", data_path,
                    words.back());
    for (size_t i = 0; i < words.size(); i += 2) {
      if (!is_number(words[i]) || std::stod(words[i]) < 0)
        throw_invalid("--data-path '{}': '{}' is not a non-negative weight; a blend is 'WEIGHT PREFIX WEIGHT PREFIX "
                      "...'", data_path, words[i]);
      entries.emplace_back(std::stod(words[i]), words[i + 1]);
    }
  } else {
    entries.emplace_back(1.0, data_path.empty() ? std::string(kDefaultDataPath) : data_path);
  }
  double total = 0;
  for (const auto& [w, p] : entries) total += w;
  if (!(total > 0)) throw_invalid("--data-path '{}': the blend weights sum to 0", data_path);

  for (const auto& [w, path] : entries) {
    auto s = std::make_unique<Source>();
    s->name = path;
    s->weight = w / total;
    std::error_code ec;
    const bool is_prefix = fs::exists(path + ".idx", ec) || fs::exists(path + ".bin", ec);
    const bool is_text_doc = !is_prefix && (fs::exists(path + "_text_document.idx", ec));
    if (is_prefix || is_text_doc || !fs::exists(path, ec)) {
      // A prefix (or a path that exists in no form: IndexedDataset names the missing .idx).
      const std::string prefix = is_text_doc ? path + "_text_document" : path;
      if (!is_prefix && !is_text_doc && !fs::exists(path + ".idx", ec))
        throw_invalid("--data-path {} does not exist: neither a text file or folder nor a preprocessed prefix "
                      "({}.idx); pass text, or run coc preprocess --output-prefix PREFIX first",
                      path, path);
      s->indexed = std::make_unique<IndexedDataset>(prefix);
      const IndexedDataset& d = *s->indexed;
      const auto b = split_bounds(fractions, d.num_documents());
      for (int i = 0; i < 3; ++i) {
        const int64_t s0 = d.document_index(b[i]), s1 = d.document_index(b[i + 1]);
        const int64_t t0 = s0 < d.num_sequences() ? d.token_offset(s0) : d.num_tokens();
        const int64_t t1 = s1 < d.num_sequences() ? d.token_offset(s1) : d.num_tokens();
        s->range[i] = {t0, std::max(t0, t1)};
      }
    } else {
      s->text = std::make_unique<ByteDataset>(path, 1);
      if (tokenizer.type() != "ByteTokenizer") {
        // Tokenize in pieces that end at a newline: SentencePiece's cost grows with the piece, and a newline is a
        // boundary no token crosses in practice.
        const auto& bytes = s->text->bytes();
        size_t pos = 0;
        while (pos < bytes.size()) {
          size_t end = std::min(bytes.size(), pos + (size_t{1} << 16));
          while (end < bytes.size() && bytes[end - 1] != '\n') ++end;
          const auto ids = tokenizer.encode(std::string_view(reinterpret_cast<const char*>(bytes.data() + pos), end - pos));
          s->ids.insert(s->ids.end(), ids.begin(), ids.end());
          pos = end;
        }
        s->text.reset();
        if (s->ids.empty()) throw_invalid("--data-path {}: the tokenizer produced no tokens", path);
      }
      const auto b = split_bounds(fractions, s->size());
      for (int i = 0; i < 3; ++i) s->range[i] = {b[i], b[i + 1]};
    }
    if (s->part(Split::kTrain) < seq_length + 1)
      throw_invalid("--data-path {}: its training part holds {} tokens but --seq-length {} needs at least {}; pass "
                    "more data, a larger training --split or a smaller --seq-length",
                    path, s->part(Split::kTrain), seq_length, seq_length + 1);
    sources_.push_back(std::move(s));
  }
  double c = 0;
  for (const auto& s : sources_) cumulative_.push_back(c += s->weight);
  cumulative_.back() = 1.0;
}

bool TrainingData::has(Split split) const {
  for (const auto& s : sources_)
    if (s->part(split) < seq_length_ + 1) return false;
  return true;
}

int64_t TrainingData::tokens(Split split) const {
  int64_t n = 0;
  for (const auto& s : sources_) n += s->part(split);
  return n;
}

void TrainingData::sample_batch(Split split, int64_t iteration, int micro_batch_index, int dp_rank, int dp_size,
                                int micro_batch_size, int seq_length, uint64_t seed, std::vector<int32_t>& tokens,
                                std::vector<int32_t>& targets) const {
  static const char* kNames[] = {"training", "validation", "test"};
  if (iteration < 0) throw_invalid("sample iteration must be >= 0, got {}", iteration);
  if (micro_batch_index < 0) throw_invalid("micro-batch index must be >= 0, got {}", micro_batch_index);
  if (dp_size < 1) throw_invalid("data-parallel size must be >= 1, got {}", dp_size);
  if (dp_rank < 0 || dp_rank >= dp_size) throw_invalid("data-parallel rank {} is outside [0, {})", dp_rank, dp_size);
  if (micro_batch_size < 1) throw_invalid("--micro-batch-size must be >= 1, got {}", micro_batch_size);
  if (seq_length < 1) throw_invalid("--seq-length must be >= 1, got {}", seq_length);
  for (const auto& s : sources_)
    if (s->part(split) < seq_length + 1)
      throw_invalid("the {} part of --data-path {} holds {} tokens but --seq-length {} needs {}; give it a larger "
                    "share with --split (e.g. 98,2,0)",
                    kNames[static_cast<int>(split)], s->name, s->part(split), seq_length, seq_length + 1);
  const uint64_t sseed = split_seed(seed, split);
  const int64_t S = seq_length, B = micro_batch_size;
  tokens.resize(static_cast<size_t>(S * B));
  targets.resize(static_cast<size_t>(S * B));
  std::vector<int32_t> buf(static_cast<size_t>(S + 1));
  const int64_t first = (static_cast<int64_t>(micro_batch_index) * dp_size + dp_rank) * B;
  for (int64_t b = 0; b < B; ++b) {
    // ByteDataset::sample_offset's draw, over this source's part of the split.
    const uint64_t key = splitmix64(splitmix64(splitmix64(sseed) ^ static_cast<uint64_t>(iteration)) ^
                                    static_cast<uint64_t>(first + b));
    size_t which = 0;
    if (sources_.size() > 1) {
      const double u = static_cast<double>(splitmix64(key ^ 0x626c656e64ULL) >> 11) * 0x1.0p-53;
      while (which + 1 < cumulative_.size() && u >= cumulative_[which]) ++which;
    }
    const Source& s = *sources_[which];
    const auto [lo, hi] = s.range[static_cast<int>(split)];
    const uint64_t count = static_cast<uint64_t>(hi - lo - S);
    const int64_t start = lo + static_cast<int64_t>((static_cast<unsigned __int128>(key) * count) >> 64);
    s.read(start, S + 1, buf.data());
    for (int32_t id : buf)
      if (id < 0 || id >= vocab_size_)
        throw_invalid("--data-path {} holds token id {} but the tokenizer's vocabulary has {} tokens; preprocess the "
                      "data with the tokenizer you train with (--tokenizer-type, --tokenizer-model)",
                      s.name, id, vocab_size_);
    for (int64_t t = 0; t < S; ++t) {
      tokens[static_cast<size_t>(t * B + b)] = buf[static_cast<size_t>(t)];
      targets[static_cast<size_t>(t * B + b)] = buf[static_cast<size_t>(t + 1)];
    }
  }
}

std::string TrainingData::description() const {
  std::string out;
  for (const auto& s : sources_) {
    if (!out.empty()) out += "; ";
    if (sources_.size() > 1) out += fmt::format("{:.3f} × ", s->weight);
    if (s->text && s->ids.empty())
      out += s->text->description();
    else
      out += fmt::format("{}: {} tokens{}", s->name, s->size(), s->indexed ? " (memory-mapped)" : "");
    if (s->part(Split::kValid) > 0 || s->part(Split::kTest) > 0)
      out += fmt::format(" (train/valid/test {}/{}/{} tokens)", s->part(Split::kTrain), s->part(Split::kValid),
                         s->part(Split::kTest));
  }
  return out;
}

}  // namespace coc
