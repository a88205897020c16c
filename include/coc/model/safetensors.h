// The safetensors file format (Hugging Face, https://github.com/huggingface/safetensors, "Format"):
//
//   u64 N (little-endian)        length of the header
//   N bytes of JSON              {"NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [BEGIN, END]},
//                                 ..., "__metadata__": {"key": "string value", ...}}  (padded with spaces so the
//                                 data starts at a multiple of 8)
//   the data                     each tensor's bytes, row-major, little-endian, at [8 + N + BEGIN, 8 + N + END);
//                                the tensors tile the data exactly, with neither gaps nor overlaps
//
// coc reads F32, F16 and BF16 tensors (Hugging Face models often ship in BF16) and writes them from fp32 buffers as
// F32 (the checkpoint shards, model/checkpoint.h: the fp32 master weights) or, for `coc convert --hf-dtype`, rounded
// to BF16 or F16. No MPI.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coc/core/dtype.h"
#include "coc/core/tensor.h"

namespace coc {

/// One tensor of a safetensors header. Offsets are relative to the start of the data (after the header).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;            ///< "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;   ///< [] is a scalar (1 element)
  uint64_t begin = 0, end = 0;  ///< data_offsets
};

/// A parsed safetensors header: the tensors in data order and the string metadata.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;      ///< sorted by begin
  std::map<std::string, std::string> metadata;
  uint64_t header_bytes = 0;                  ///< N
  uint64_t data_offset() const { return 8 + header_bytes; }
  uint64_t data_bytes() const { return tensors.empty() ? 0 : tensors.back().end; }
  /// The entry named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
};

/// Bytes per element of a safetensors dtype name, 0 for one coc does not know.
int safetensors_dtype_bytes(const std::string& dtype);

/// The safetensors name of a type coc writes: "F32", "BF16" or "F16". Errors (uniform kInvalidArgument): kInt8 (coc
/// writes no integer tensors).
const char* safetensors_dtype_name(DType t);

/// The header text (JSON, space-padded so that 8 + its length is a multiple of 8) of `tensors` (fp32 in memory)
/// stored as `dtype` (F32, BF16 or F16: 4 or 2 bytes per element), laid out in the given order, with `metadata` as
/// "__metadata__" (omitted when empty). Errors (uniform kInvalidArgument): an empty, duplicate or "__metadata__"
/// name; dtype kInt8.
std::string safetensors_header(const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                               const std::map<std::string, std::string>& metadata, DType dtype = DType::kF32);

/// Parses header text (without the length prefix) of a file of `file_bytes` bytes and checks it against the format:
/// a JSON object, known dtypes, offsets that match the shapes and tile [0, data_bytes) exactly, string metadata, and
/// a file that ends exactly where the data does. Throws std::runtime_error with the reason (the caller names the
/// file and the error kind).
SafetensorsHeader parse_safetensors_header(const std::string& text, uint64_t file_bytes);

/// Reads a safetensors file's header (throws kIo when unreadable, kCorrupt naming `path` and the reason when it is
/// not a valid safetensors file).
SafetensorsHeader read_safetensors_header(const std::string& path);

/// Reads tensor `e` of the file at `path` (whose header is `h`) as fp32 into `out` (resized to e.shape).
/// F16 and BF16 are widened exactly. Errors: kIo when unreadable, kInvalidArgument for a dtype coc cannot read.
void read_safetensors_tensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsEntry& e,
                             Tensor& out);

/// Writes fp32 `tensors` (in this order) and `metadata` to `path` as a safetensors file of `dtype` tensors, replacing
/// it atomically (temporary file, fsync, rename). BF16 and F16 round each value to nearest even (fp32_to_half,
/// coc/core/bf16.h; F16 overflows to ±inf beyond 65504, as PyTorch's .half() does). Errors: kIo naming the path and
/// the OS error; kInvalidArgument as safetensors_header.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata, DType dtype = DType::kF32);

}  // namespace coc
