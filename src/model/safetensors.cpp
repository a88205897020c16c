#include "coc/model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "coc/core/bf16.h"
#include "coc/core/error.h"

namespace coc {
namespace {

using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

/// Far above any real header (the format's own limit is 100 MB); rejects a garbage length before allocating it.
constexpr uint64_t kMaxHeaderBytes = uint64_t{256} << 20;

[[noreturn]] void bad(const std::string& why) { throw std::runtime_error(why); }

/// Writes the n fp32 values at `x` to `f` as `dtype`; false on a write error. 16-bit types go through a block
/// buffer so that a multi-GB tensor needs no second copy of itself.
bool write_elements(std::FILE* f, const float* x, int64_t n, DType dtype) {
  if (dtype == DType::kF32) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    return bytes == 0 || std::fwrite(x, 1, bytes, f) == bytes;
  }
  constexpr int64_t kBlock = int64_t{1} << 16;
  std::vector<uint16_t> half(static_cast<size_t>(std::min(n, kBlock)));
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    fp32_to_half(dtype, x + i, half.data(), m);
    if (std::fwrite(half.data(), 2, static_cast<size_t>(m), f) != static_cast<size_t>(m)) return false;
  }
  return true;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const SafetensorsEntry& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

int safetensors_dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kInt8: break;
  }
  throw_invalid("cannot write safetensors tensors as {}; coc writes fp32, bf16 or fp16", to_string(t));
}

std::string safetensors_header(const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                               const std::map<std::string, std::string>& metadata, DType dtype) {
  const char* dtype_name = safetensors_dtype_name(dtype);
  json h = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw_invalid("cannot write safetensors tensor named '{}'; use a non-empty name other than __metadata__", name);
    if (h.contains(name)) throw_invalid("cannot write safetensors: tensor name '{}' appears twice", name);
    COC_ASSERT(t != nullptr, "safetensors tensor '{}' is null", name);
    const uint64_t bytes = static_cast<uint64_t>(t->numel()) * static_cast<uint64_t>(dtype_size(dtype));
    h[name] = {{"dtype", dtype_name}, {"shape", t->shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  // The format pads the header with spaces so that the data (at 8 + N) is 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsHeader parse_safetensors_header(const std::string& text, uint64_t file_bytes) {
  SafetensorsHeader out;
  out.header_bytes = text.size();
  json h = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) bad("the header is not a JSON object");
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const json& t = it.value();
    SafetensorsEntry e;
    e.name = it.key();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2)
      bad("tensor '" + e.name + "' lacks dtype, shape or data_offsets");
    e.dtype = t["dtype"].get<std::string>();
    const int elem = safetensors_dtype_bytes(e.dtype);
    if (elem == 0) bad("tensor '" + e.name + "' has unknown dtype " + e.dtype);
    uint64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned()) bad("tensor '" + e.name + "' has a bad shape " + t["shape"].dump());
      const uint64_t v = d.get<uint64_t>();
      if (v > 0 && numel > (uint64_t{1} << 60) / v) bad("tensor '" + e.name + "' has an impossible shape");
      numel *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    for (const json& o : t["data_offsets"])
      if (!o.is_number_unsigned()) bad("tensor '" + e.name + "' has bad data_offsets");
    e.begin = t["data_offsets"][0].get<uint64_t>();
    e.end = t["data_offsets"][1].get<uint64_t>();
    if (e.end < e.begin || e.end - e.begin != numel * static_cast<uint64_t>(elem))
      bad("tensor '" + e.name + "' has data_offsets that do not match its shape and dtype");
    out.tensors.push_back(std::move(e));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : out.tensors) {
    if (e.begin != pos) bad("tensor '" + e.name + "' leaves a gap or overlaps the previous tensor");
    pos = e.end;
  }
  const uint64_t expected = 8 + text.size() + pos;
  if (file_bytes < expected)
    bad("truncated at byte " + std::to_string(file_bytes) + " of " + std::to_string(expected));
  if (file_bytes > expected)
    bad(std::to_string(file_bytes - expected) + " unexpected bytes after byte " + std::to_string(expected));
  return out;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_error(ErrorKind::kIo, "cannot open {}: {}; pass an existing safetensors file", path, std::strerror(errno));
  std::fseek(f, 0, SEEK_END);
  const uint64_t size = static_cast<uint64_t>(std::ftell(f));
  std::fseek(f, 0, SEEK_SET);
  uint64_t n = 0;
  std::string text;
  const bool ok_len = size >= 8 && std::fread(&n, 1, 8, f) == 8;
  const bool ok = ok_len && n <= kMaxHeaderBytes && 8 + n <= size;
  if (ok) {
    text.resize(n);
    if (std::fread(text.data(), 1, n, f) != n) {
      std::fclose(f);
      throw_error(ErrorKind::kIo, "cannot read {}: {}", path, std::strerror(errno));
    }
  }
  std::fclose(f);
  if (!ok)
    throw_error(ErrorKind::kCorrupt, "{} is not a valid safetensors file (truncated at byte {}, or a header length of "
                "{} bytes); pass a complete .safetensors file",
                path, size, n);
  try {
    return parse_safetensors_header(text, size);
  } catch (const std::runtime_error& e) {
    throw_error(ErrorKind::kCorrupt, "{} is not a valid safetensors file ({}); pass a complete .safetensors file",
                path, e.what());
  }
}

void read_safetensors_tensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsEntry& e,
                             Tensor& out) {
  const int elem = safetensors_dtype_bytes(e.dtype);
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    throw_invalid("{}: tensor '{}' has dtype {}; coc reads F32, F16 and BF16 weights", path, e.name, e.dtype);
  out.resize(e.shape);
  const uint64_t n = (e.end - e.begin) / static_cast<uint64_t>(elem);
  std::vector<char> raw(e.end - e.begin);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  bool ok = f && ::fseeko(f, static_cast<off_t>(h.data_offset() + e.begin), SEEK_SET) == 0 &&
            std::fread(raw.data(), 1, raw.size(), f) == raw.size();
  const int err = errno;
  if (f) std::fclose(f);
  if (!ok) throw_error(ErrorKind::kIo, "cannot read tensor '{}' of {}: {}", e.name, path, std::strerror(err));
  if (e.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    std::vector<uint16_t> half(n);
    std::memcpy(half.data(), raw.data(), raw.size());
    half_to_fp32(e.dtype == "F16" ? DType::kF16 : DType::kBF16, half.data(), out.data(), static_cast<int64_t>(n));
  }
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata, DType dtype) {
  const std::string text = safetensors_header(tensors, metadata, dtype);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  auto fail = [&](const char* what, int err) {
    if (f) std::fclose(f);
    ::unlink(tmp.c_str());
    throw_error(ErrorKind::kIo, "{} {}: {}; free disk space or fix the permissions", what, tmp, std::strerror(err));
  };
  if (!f) fail("cannot create", errno);
  const uint64_t n = text.size();
  bool ok = std::fwrite(&n, 1, 8, f) == 8 && std::fwrite(text.data(), 1, n, f) == n;
  for (const auto& [name, t] : tensors) ok = ok && write_elements(f, t->data(), t->numel(), dtype);
  if (!ok || std::fflush(f) != 0) fail("cannot write", errno);
  if (::fsync(::fileno(f)) != 0) fail("cannot sync", errno);
  std::fclose(f);
  f = nullptr;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename into place", errno);
}

}  // namespace coc
