// --coc-tuning-cache: see include/coc/overlap/tuning_cache.h.
#include "coc/overlap/tuning_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "coc/comm/process.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"

namespace coc {

namespace {
constexpr const char* kFormat = "coc-tuning-cache";
constexpr int kVersion = 1;

std::mutex g_mu;
std::shared_ptr<TuningCache> g_cache;
std::map<const Communicator*, std::string> g_links;  // link_fingerprint per communicator

const char* algo_name(CocCommAlgo a) { return a == CocCommAlgo::kP2p ? "p2p" : "collective"; }

nlohmann::json to_json(const TuningEntry& e) {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& [label, ms] : e.candidates_ms) c.push_back({label, ms});
  return {{"op", e.op},
          {"m", e.m},
          {"k", e.k},
          {"n", e.n},
          {"deterministic", e.deterministic},
          {"gemm_dtype", e.gemm_dtype},
          {"comm_dtype", e.comm_dtype},
          {"group_size", e.group_size},
          {"link", e.link},
          {"mpi_library", e.mpi_library},
          {"coc_version", e.coc_version},
          {"parallel_num", e.parallel_num},
          {"comm_algo", algo_name(e.algo)},
          {"candidates_ms", c}};
}

// Throws the one-line refusal of a corrupt file.
[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw_invalid("--coc-tuning-cache {}: {}; it is not a coc tuning cache that can be trusted: delete it (the next "
                "run times again and rewrites it) or pass another file",
                path, what);
}

TuningEntry from_json(const nlohmann::json& j, size_t i, const std::string& path) {
  auto need = [&](const char* key, auto check, const char* type) -> const nlohmann::json& {
    if (!j.contains(key) || !check(j.at(key))) corrupt(path, fmt::format("entry {} has no {} \"{}\"", i, type, key));
    return j.at(key);
  };
  auto is_int = [](const nlohmann::json& v) { return v.is_number_integer(); };
  auto is_str = [](const nlohmann::json& v) { return v.is_string(); };
  TuningEntry e;
  e.op = need("op", is_str, "string").get<std::string>();
  e.m = need("m", is_int, "integer").get<int64_t>();
  e.k = need("k", is_int, "integer").get<int64_t>();
  e.n = need("n", is_int, "integer").get<int64_t>();
  e.deterministic = need("deterministic", [](const nlohmann::json& v) { return v.is_boolean(); }, "boolean").get<bool>();
  for (auto [key, field] : {std::pair{"gemm_dtype", &e.gemm_dtype}, std::pair{"comm_dtype", &e.comm_dtype}})
    if (j.contains(key)) *field = need(key, is_str, "string").get<std::string>();  // absent: an fp32 entry
  e.group_size = need("group_size", is_int, "integer").get<int>();
  e.link = need("link", is_str, "string").get<std::string>();
  e.mpi_library = need("mpi_library", is_str, "string").get<std::string>();
  e.coc_version = need("coc_version", is_str, "string").get<std::string>();
  e.parallel_num = need("parallel_num", is_int, "integer").get<int>();
  const std::string algo = need("comm_algo", is_str, "string").get<std::string>();
  if (e.parallel_num < 1 || e.parallel_num > 4096 || (algo != "collective" && algo != "p2p"))
    corrupt(path, fmt::format("entry {} chooses parallel_num {} with comm_algo '{}' (N from 1 to 4096, collective "
                              "or p2p)",
                              i, e.parallel_num, algo));
  e.algo = algo == "p2p" ? CocCommAlgo::kP2p : CocCommAlgo::kCollective;
  if (j.contains("candidates_ms") && j["candidates_ms"].is_array())
    for (const auto& c : j["candidates_ms"])
      if (c.is_array() && c.size() == 2 && c[0].is_string() && c[1].is_number())
        e.candidates_ms.emplace_back(c[0].get<std::string>(), c[1].get<double>());
  return e;
}
}  // namespace

bool TuningEntry::same_shape(const TuningEntry& o) const {
  return op == o.op && m == o.m && k == o.k && n == o.n && deterministic == o.deterministic &&
         gemm_dtype == o.gemm_dtype && comm_dtype == o.comm_dtype;
}

bool TuningEntry::matches(const TuningEntry& o) const {
  return same_shape(o) && group_size == o.group_size && link == o.link && mpi_library == o.mpi_library &&
         coc_version == o.coc_version;
}

std::shared_ptr<TuningCache> TuningCache::parse(const std::string& text, const std::string& path, bool writer) {
  std::shared_ptr<TuningCache> c(new TuningCache(path, writer));
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    corrupt(path, fmt::format("not JSON at byte {}", e.byte));
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat)
    corrupt(path, fmt::format("not a \"format\": \"{}\" object", kFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kVersion)
    corrupt(path, fmt::format("file format version {} (this coc reads version {})",
                              j.contains("version") ? j["version"].dump() : "missing", kVersion));
  if (!j.contains("entries") || !j["entries"].is_array()) corrupt(path, "no \"entries\" array");
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    if (!j["entries"][i].is_object()) corrupt(path, fmt::format("entry {} is not an object", i));
    c->entries_.push_back(from_json(j["entries"][i], i, path));
  }
  return c;
}

std::shared_ptr<TuningCache> TuningCache::open(Communicator& world, const std::string& path) {
  // Rank 0 reads; the others get its text (and its read error, so that every rank fails alike). The first byte
  // says which: 'm' missing (an empty cache), 'f' the file's text, 'e' a read error.
  std::string msg;
  if (world.rank() == 0) {
    std::error_code ec;
    const std::filesystem::path p(path);
    if (std::filesystem::is_directory(p, ec)) {
      msg = "e is a directory; pass a file name";
    } else if (!std::filesystem::exists(p, ec)) {
      const std::filesystem::path dir = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
      msg = std::filesystem::is_directory(dir, ec) ? "m" : "e is in a folder that does not exist; create it first";
    } else {
      std::ifstream f(path, std::ios::binary);
      if (!f) {
        msg = fmt::format("e cannot be read ({})", std::strerror(errno));
      } else {
        msg = "f";
        msg.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      }
    }
  }
  msg = world.broadcast_string(std::move(msg), 0, "tuning cache");
  if (msg.empty() || msg[0] == 'e') throw_invalid("--coc-tuning-cache {}:{}", path, msg.empty() ? "" : msg.substr(1));
  return parse(msg.substr(1), path, world.rank() == 0);
}

std::optional<TuningEntry> TuningCache::find(const TuningEntry& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const TuningEntry& e : entries_)
    if (e.matches(key)) return e;
  return std::nullopt;
}

bool TuningCache::has_other_setting(const TuningEntry& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const TuningEntry& e) { return e.same_shape(key) && !e.matches(key); });
}

void TuningCache::store(TuningEntry e) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const TuningEntry& x) { return x.matches(e); });
  entries_.push_back(std::move(e));
  dirty_ = true;
}

size_t TuningCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void TuningCache::save() {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!writer_ || !dirty_) return;
    nlohmann::json arr = nlohmann::json::array();
    for (const TuningEntry& e : entries_) arr.push_back(to_json(e));
    text = nlohmann::json{{"format", kFormat}, {"version", kVersion}, {"entries", arr}}.dump(1) + "\n";
    dirty_ = false;
  }
  // Temporary file in the same folder, fsync, rename: a reader (the next run) sees the old file or the new one.
  const std::string tmp = fmt::format("{}.tmp.{}", path_, ::getpid());
  auto fail = [&](const char* what, int err) {
    std::remove(tmp.c_str());
    throw_error(ErrorKind::kIo, "rank {}: --coc-tuning-cache {}: {} ({}); check the folder's space and permissions",
                log::rank(), path_, what, std::strerror(err));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create the temporary file", errno);
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
    const int err = errno;
    std::fclose(f);
    fail("cannot write", err);
  }
  if (std::fclose(f) != 0) fail("cannot close", errno);
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) fail("cannot rename into place", errno);
}

std::string link_fingerprint(Communicator& group) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_links.find(&group); it != g_links.end()) return it->second;
  }
  // The hosts in rank order, and the transport knobs that change a link's speed. Rank 0's view is everyone's. Not
  // its measured speed: too noisy on a shared machine to key a cache on (docs/design.md, "Tuning that persists").
  const std::vector<std::string> hosts = group.gather_bytes(processor_name(), 0, "tuning cache: hosts");
  std::string fp;
  if (group.rank() == 0) {
    std::vector<std::string> distinct;
    std::string order;
    for (const std::string& h : hosts) {
      auto it = std::find(distinct.begin(), distinct.end(), h);
      if (it == distinct.end()) distinct.push_back(h), it = distinct.end() - 1;
      order += fmt::format("{}{}", order.empty() ? "" : ",", it - distinct.begin());
    }
    std::string names;
    for (const std::string& h : distinct) names += fmt::format("{}{}", names.empty() ? "" : ",", h);
    const auto cvars = control_variables({"btl", "btl_tcp_if_include"});
    fp = fmt::format("hosts {} (ranks on hosts {}); btl '{}'; tcp if '{}'; engine {}; non-blocking {}", names,
                     order, cvars[0].value_or(env::get(env::Var::kOmpiBtl)),
                     cvars[1].value_or(env::get(env::Var::kOmpiBtlTcpIfInclude)), to_string(group.options().engine),
                     to_string(group.options().nonblocking));
  }
  fp = group.broadcast_string(std::move(fp), 0, "tuning cache: link");
  std::lock_guard<std::mutex> lock(g_mu);
  g_links[&group] = fp;
  return fp;
}

void set_tuning_cache(std::shared_ptr<TuningCache> cache) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cache = std::move(cache);
  g_links.clear();
}

std::shared_ptr<TuningCache> tuning_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_cache;
}

}  // namespace coc
