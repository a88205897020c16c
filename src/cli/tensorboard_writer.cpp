#include "cli/tensorboard_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "coc/core/error.h"

namespace coc::cli {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

/// TFRecord stores a rotated and offset CRC so that a CRC of data holding CRCs stays well distributed.
uint32_t masked_crc(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
/// A length-delimited field (wire type 2): key, length, bytes.
void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
/// The Event header shared by every record: wall_time (field 1, fixed64 double) and step (field 2, varint).
std::string event_header(double wall_time_s, int64_t step) {
  std::string e;
  uint64_t bits = 0;
  std::memcpy(&bits, &wall_time_s, sizeof bits);
  put_varint(e, (1 << 3) | 1);
  put_le(e, bits, 8);
  put_varint(e, (2 << 3) | 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw_error(ErrorKind::kIo, "--tensorboard-dir {}: cannot create the directory ({}); pass a writable directory",
                dir, ec ? ec.message() : "a file of that name exists");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}", dir, std::chrono::duration_cast<std::chrono::seconds>(now).count(),
                      host);
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_)
    throw_error(ErrorKind::kIo, "--tensorboard-dir {}: cannot write {}: {}; pass a writable directory", dir, path_,
                std::strerror(errno));
  std::string e = event_header(std::chrono::duration<double>(now).count(), 0);
  put_bytes_field(e, 3, "brain.Event:2");
  write_record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalar(std::string_view tag, float value, int64_t step, double wall_time_s) {
  std::string v;
  put_bytes_field(v, 1, tag);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_varint(v, (2 << 3) | 5);  // simple_value: fixed32 float
  put_le(v, bits, 4);
  std::string summary;
  put_bytes_field(summary, 1, v);
  std::string e = event_header(wall_time_s, step);
  put_bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  std::string rec;
  put_le(rec, payload.size(), 8);
  put_le(rec, masked_crc(rec), 4);
  rec += payload;
  put_le(rec, masked_crc(payload), 4);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw_error(ErrorKind::kIo, "cannot write {}: {} (disk full?)", path_, std::strerror(errno));
}

}  // namespace coc::cli
