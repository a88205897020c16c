// A TensorBoard event file writer for scalars (what `coc train --tensorboard-dir` writes), with no TensorFlow or
// protobuf library: the file format is TFRecord, and the two messages it needs are small enough to encode by hand.
//
// File: records of [uint64 length][uint32 masked CRC32C of the 8 length bytes][payload][uint32 masked CRC32C of
// the payload], little-endian (TensorFlow's tensorflow/core/lib/io/record_writer.cc). The payload is a serialized
// tensorflow.Event (tensorflow/core/util/event.proto): wall_time = 1 (double, seconds since the epoch), step = 2
// (int64), file_version = 3 (string, "brain.Event:2" in the first record), summary = 5 (Summary: repeated
// Value value = 1; Value: tag = 1 (string), simple_value = 2 (float)).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace coc::cli {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, as TFRecord uses it.
uint32_t crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  /// Creates `dir` if needed and opens `dir`/events.out.tfevents.<seconds>.<hostname> (TensorBoard's naming, so that
  /// `tensorboard --logdir DIR` finds it), then writes the file_version record. Throws a uniform kIo error naming
  /// the directory when it cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Appends one Event holding one scalar and flushes it to the OS, so that a killed run keeps every record written.
  void add_scalar(std::string_view tag, float value, int64_t step, double wall_time_s);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace coc::cli
