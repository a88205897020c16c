// `coc preprocess`: the counterpart of Megatron's tools/preprocess_data.py. Tokenizes text or JSON lines into
// Megatron's indexed dataset (model/indexed_dataset.h), PREFIX_<key>_document.bin/.idx, one sequence per document:
//   --input FILE|DIR   a .json/.jsonl file (one JSON object per line; --json-keys picks the fields, one output per
//                      key), or text: a file, or a folder whose files (sorted by path, .dat skipped) are one
//                      document each;
//   --append-eod       the tokenizer's end-of-document id after every document;
//   --workers N        threads that tokenize batches of documents; the output is in input order whatever N.
// One process, no MPI (main runs it without MPI_Init). A progress bar on a terminal; a summary line always.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "coc/core/error.h"
#include "coc/core/progress_bar.h"
#include "coc/model/indexed_dataset.h"
#include "coc/model/tokenizer.h"

namespace coc::cli {
namespace {

namespace fs = std::filesystem;

struct PreprocessOptions {
  std::string input, output_prefix, tokenizer_type = "ByteTokenizer", tokenizer_model;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
};

bool is_json_input(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".json" || ext == ".jsonl";
}

/// Text files of a folder, sorted by path (the same on every run), fortune's .dat indexes skipped.
std::vector<std::string> text_files(const std::string& dir) {
  std::vector<std::string> files, unique;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink))
    if (e.is_regular_file() && e.path().extension() != ".dat") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  // A file reached under two names (fortunes ships art.u8 -> art) is one document, by its first name.
  std::set<std::string> seen;
  for (const std::string& f : files)
    if (seen.insert(fs::canonical(f).string()).second) unique.push_back(f);
  return unique;
}

std::string read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_invalid("--input {}: cannot read the file", path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int run_preprocess(const PreprocessOptions& o) {
  if (o.input.empty() || o.output_prefix.empty())
    throw_invalid("coc preprocess needs --input FILE|DIR and --output-prefix PREFIX");
  std::error_code ec;
  if (!fs::exists(o.input, ec)) throw_invalid("--input {} does not exist; pass a text file, a folder or a .jsonl file", o.input);
  if (o.workers < 1) throw_invalid("--workers must be >= 1 (got {})", o.workers);
  if (o.json_keys.empty()) throw_invalid("--json-keys needs at least one key (e.g. text)");
  const auto tokenizer = make_tokenizer(o.tokenizer_type, o.tokenizer_model);
  const bool json_input = fs::is_regular_file(o.input, ec) && is_json_input(o.input);
  // Text input has one field; JSON lines one output per key (Megatron's naming: PREFIX_<key>_document).
  const std::vector<std::string> keys = json_input ? o.json_keys : std::vector<std::string>{"text"};
  const IndexedDType dtype = indexed_dtype_for_vocab(tokenizer->vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& k : keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(o.output_prefix + "_" + k + "_document", dtype));

  std::vector<std::string> files;
  if (json_input || fs::is_regular_file(o.input, ec)) {
    files.push_back(o.input);
  } else {
    files = text_files(o.input);
    if (files.empty()) throw_invalid("--input {}: the folder holds no files", o.input);
  }
  int64_t total_bytes = 0;
  for (const std::string& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f, ec));

  const bool bar = is_terminal(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  int64_t done_bytes = 0, docs = 0, line_no = 0;
  // A batch of documents (per key: its text), tokenized by the workers, written in order.
  std::vector<std::vector<std::string>> batch;  // [doc][key]
  auto flush = [&]() {
    if (batch.empty()) return;
    std::vector<std::vector<std::vector<int32_t>>> ids(batch.size());
    std::vector<std::thread> threads;
    const size_t per = (batch.size() + static_cast<size_t>(o.workers) - 1) / static_cast<size_t>(o.workers);
    for (int w = 0; w < o.workers; ++w)
      threads.emplace_back([&, w] {
        for (size_t d = static_cast<size_t>(w) * per; d < std::min(batch.size(), (static_cast<size_t>(w) + 1) * per); ++d)
          for (const std::string& text : batch[d]) {
            ids[d].push_back(tokenizer->encode(text));
            if (o.append_eod) ids[d].back().push_back(tokenizer->eod());
          }
      });
    for (auto& t : threads) t.join();
    for (auto& doc : ids)
      for (size_t k = 0; k < doc.size(); ++k)
        builders[k]->add_document(doc[k].data(), static_cast<int64_t>(doc[k].size()));
    docs += static_cast<int64_t>(batch.size());
    batch.clear();
    if (bar) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\r\033[K%s %lld documents, %.1f MB/s", progress_bar(done_bytes, total_bytes).c_str(),
                   static_cast<long long>(docs), done_bytes / 1e6 / std::max(s, 1e-9));
    }
  };
  const size_t batch_docs = static_cast<size_t>(std::max<int64_t>(64, o.log_interval));
  // A batch also ends at 64 MiB of text, so that memory stays bounded whatever the document sizes.
  constexpr int64_t kBatchBytes = int64_t{64} << 20;
  int64_t batch_bytes = 0;
  for (const std::string& file : files) {
    if (!json_input) {
      std::string text = read_whole(file);
      done_bytes += static_cast<int64_t>(text.size());
      batch_bytes += static_cast<int64_t>(text.size());
      if (!text.empty()) batch.push_back({std::move(text)});
      if (batch.size() >= batch_docs || batch_bytes >= kBatchBytes) {
        flush();
        batch_bytes = 0;
      }
      continue;
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) throw_invalid("--input {}: cannot read the file", file);
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      done_bytes += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object())
        throw_invalid("--input {}: line {} is not a JSON object; pass JSON lines ({{\"text\": \"...\"}} per line)", file,
                      line_no);
      std::vector<std::string> fields;
      for (const std::string& k : keys) {
        if (!j.contains(k) || !j[k].is_string())
          throw_invalid("--input {}: line {} has no string field '{}'; pass the field's name with --json-keys", file,
                        line_no, k);
        fields.push_back(j[k].get<std::string>());
      }
      batch_bytes += static_cast<int64_t>(line.size());
      batch.push_back(std::move(fields));
      if (batch.size() >= batch_docs || batch_bytes >= kBatchBytes) {
        flush();
        batch_bytes = 0;
      }
    }
  }
  flush();
  for (auto& b : builders) b->finalize();
  if (bar) std::fprintf(stderr, "\r\033[K");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t k = 0; k < keys.size(); ++k)
    std::printf("coc preprocess: %lld documents, %lld tokens (%s) -> %s_%s_document.bin/.idx in %.1f s\n",
                static_cast<long long>(docs), static_cast<long long>(builders[k]->tokens()), o.tokenizer_type.c_str(),
                o.output_prefix.c_str(), keys[k].c_str(), s);
  return 0;
}

}  // namespace

Runner add_preprocess_command(CLI::App& app) {
  auto o = std::make_shared<PreprocessOptions>();
  CLI::App* cmd = app.add_subcommand("preprocess", "Tokenize text or JSON lines into Megatron's indexed dataset "
                                                   "(PREFIX_text_document.bin/.idx), like tools/preprocess_data.py");
  cmd->add_option("--input", o->input, "A .json/.jsonl file of JSON lines, or a text file or folder")->required();
  cmd->add_option("--output-prefix", o->output_prefix, "Writes PREFIX_<key>_document.bin and .idx")->required();
  cmd->add_option("--json-keys", o->json_keys, "JSON fields to tokenize, one output each")->capture_default_str();
  cmd->add_option("--tokenizer-type", o->tokenizer_type, "ByteTokenizer or SentencePieceTokenizer")
      ->capture_default_str();
  cmd->add_option("--tokenizer-model", o->tokenizer_model, "SentencePiece model file");
  cmd->add_flag("--append-eod", o->append_eod, "Append the end-of-document token to every document");
  cmd->add_option("--workers", o->workers, "Tokenizing threads")->capture_default_str();
  cmd->add_option("--log-interval", o->log_interval, "Documents per batch between progress updates")
      ->capture_default_str();
  return [o] { return run_preprocess(*o); };
}

}  // namespace coc::cli
