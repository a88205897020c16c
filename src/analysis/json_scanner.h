// A tolerant, streaming JSON lexer for profiler traces (internal to src/analysis/).
//
// Why our own lexer and not nlohmann/simdjson: traces are 0.3–10 GB per rank (edge case 31 of docs/edge-cases.md) and
// real ones carry malformed strings (edge case 24: raw control characters, unescaped backslashes such as "C:\path", raw
// newlines, bad UTF-8) that strict parsers reject, losing the whole file. This lexer reads through a fixed 1 MiB buffer
// (zlib's gzread, which also reads uncompressed files as they are), never materialises the document, and
// repairs what it can inside strings, telling the caller so it can count the event (RankReport::malformed_events).
//
// Errors: ParseError{offset, message} with the byte offset in the *uncompressed* stream; analyze_file turns it into
// a one-line coc::Error naming the file. Structure errors inside one trace event can be skipped with
// resync_event(), which looks for the next event at the start of a line (Kineto, torch_npu and coc all write one
// event per line); at end of input that is a truncation error, never a silent partial result.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>

namespace coc::analysis::detail {

struct ParseError {
  uint64_t offset = 0;
  std::string message;
  bool io = false;  ///< the file could not be opened: no byte offset to report
};

/// A decimal number as written in the trace: µs for ts/dur, possibly a string ("1704161511422904.204", Ascend).
struct NumberText {
  char text[48] = {};
  uint8_t len = 0;
  bool valid() const { return len > 0; }
};

/// Parses a decimal µs value into exact integer ns (rounded half away from zero beyond the 3rd decimal).
/// Returns false for text that is not a number.
bool number_to_ns(const NumberText& n, int64_t& ns);
/// The same text as a double (µs), for HTA's float arithmetic (Convention::kHta).
double number_to_double(const NumberText& n);
/// Parses an integer (e.g. a pid above 2^32); false if not an integer or out of int64 range.
bool number_to_int(const NumberText& n, int64_t& v);

class JsonScanner {
 public:
  /// Opens `path` (plain or gzip). Throws ParseError{0, ...} when it cannot be opened.
  explicit JsonScanner(const std::string& path);
  ~JsonScanner();
  JsonScanner(const JsonScanner&) = delete;
  JsonScanner& operator=(const JsonScanner&) = delete;

  /// Next non-whitespace byte without consuming it; -1 at end of input.
  int peek();
  /// Consumes `c` if it is the next non-whitespace byte.
  bool accept(char c);
  /// Consumes `c` or throws ParseError naming `what`.
  void expect(char c, const char* what);
  /// Reads a string value (the next token must be '"') into `out`, repairing malformed content. Returns true when
  /// something was repaired.
  bool read_string(std::string& out);
  /// Reads a number token, or a string holding a number (Ascend writes ts as strings). Returns false (and skips
  /// the value) when the value is neither.
  bool read_number(NumberText& out);
  /// Skips one value of any type. Strings inside are skipped without copying.
  void skip_value();
  /// After a structure error inside an event: skips to the next line starting with '{' (or the closing ']').
  /// Throws ParseError at end of input.
  void resync_event();

  uint64_t offset() const { return consumed_ + pos_; }           ///< uncompressed bytes consumed
  uint64_t compressed_offset();                                  ///< for progress on .gz files
  uint64_t file_size() const { return file_size_; }
  [[noreturn]] void fail(const std::string& message) const;

 private:
  bool fill();  // refills the buffer; false at EOF
  int get() {
    if (pos_ == end_ && !fill()) return -1;
    return static_cast<unsigned char>(buf_[pos_++]);
  }
  bool skip_string_body();  // after the opening quote; returns "repaired"
  bool read_utf8_tail(unsigned char lead, std::string& out);

  gzFile gz_ = nullptr;
  char* buf_ = nullptr;
  size_t pos_ = 0, end_ = 0;
  uint64_t consumed_ = 0;  // bytes before buf_[0]
  uint64_t file_size_ = 0;
  bool eof_ = false;
};

}  // namespace coc::analysis::detail
