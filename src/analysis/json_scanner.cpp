#include "json_scanner.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace coc::analysis::detail {

namespace {
constexpr size_t kBufferBytes = 1 << 20;
constexpr int kMaxDepth = 512;  // deeper nesting is not a trace; refuse instead of recursing forever

bool is_ws(int c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace

bool number_to_int(const NumberText& n, int64_t& v) {
  if (!n.valid()) return false;
  const char* p = n.text;
  bool neg = false;
  if (*p == '-') neg = true, ++p;
  if (*p < '0' || *p > '9') return false;
  uint64_t acc = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    if (acc > (std::numeric_limits<uint64_t>::max() - 9) / 10) return false;
    acc = acc * 10 + static_cast<uint64_t>(*p - '0');
  }
  if (*p == '.') {  // "7.0" is still the integer 7
    for (++p; *p == '0'; ++p) {}
    if (*p >= '1' && *p <= '9') return false;
  }
  if (*p != 0) return false;
  if (acc > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  v = neg ? -static_cast<int64_t>(acc) : static_cast<int64_t>(acc);
  return true;
}

bool number_to_ns(const NumberText& n, int64_t& ns) {
  if (!n.valid()) return false;
  const char* p = n.text;
  bool neg = false;
  if (*p == '-') neg = true, ++p;
  if ((*p < '0' || *p > '9') && *p != '.') return false;
  int64_t whole = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9'; ++p, ++digits) {
    if (digits >= 18) {  // int64 ns cannot hold it: approximate through a double
      double d = std::strtod(n.text, nullptr);
      if (!std::isfinite(d) || std::fabs(d) > 9e15) return false;
      ns = std::llround(d * 1000.0);
      return true;
    }
    whole = whole * 10 + (*p - '0');
  }
  int64_t frac = 0;
  int fd = 0;
  bool round_up = false;
  if (*p == '.') {
    for (++p; *p >= '0' && *p <= '9'; ++p, ++fd) {
      if (fd < 3) frac = frac * 10 + (*p - '0');
      else if (fd == 3) round_up = *p >= '5';
    }
  }
  if (*p == 'e' || *p == 'E') {  // exponent notation: rare (some exporters), take the double route
    double d = std::strtod(n.text, nullptr);
    if (!std::isfinite(d) || std::fabs(d) > 9e15) return false;
    ns = std::llround(d * 1000.0);
    return true;
  }
  if (*p != 0) return false;
  for (int i = fd; i < 3; ++i) frac *= 10;
  if (whole > (std::numeric_limits<int64_t>::max() - 1000) / 1000) return false;  // > 9.2e15 µs: not a timestamp
  int64_t v = whole * 1000 + frac + (round_up ? 1 : 0);
  ns = neg ? -v : v;
  return true;
}

double number_to_double(const NumberText& n) { return std::strtod(n.text, nullptr); }

JsonScanner::JsonScanner(const std::string& path) {
  auto cannot_open = [](int err) {
    std::string why = err == ENOENT ? "no such file or directory" : std::strerror(err);
    if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
    return ParseError{0, "cannot open: " + why, true};
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw cannot_open(errno);
  if (S_ISDIR(st.st_mode)) throw ParseError{0, "is a directory, not a trace file", true};
  file_size_ = static_cast<uint64_t>(st.st_size);
  gz_ = ::gzopen(path.c_str(), "rb");
  if (!gz_) throw cannot_open(errno ? errno : EIO);
  ::gzbuffer(gz_, 256 * 1024);
  buf_ = new char[kBufferBytes];
}

JsonScanner::~JsonScanner() {
  if (gz_) ::gzclose(gz_);
  delete[] buf_;
}

void JsonScanner::fail(const std::string& message) const { throw ParseError{offset(), message}; }

uint64_t JsonScanner::compressed_offset() {
  const z_off_t o = ::gzoffset(gz_);
  return o < 0 ? 0 : static_cast<uint64_t>(o);
}

bool JsonScanner::fill() {
  if (eof_) return false;
  consumed_ += end_;
  pos_ = end_ = 0;
  const int n = ::gzread(gz_, buf_, static_cast<unsigned>(kBufferBytes));
  if (n < 0) {
    int err = 0;
    const char* msg = ::gzerror(gz_, &err);
    throw ParseError{consumed_, fmt::format("read error ({})", msg ? msg : "zlib")};
  }
  if (n == 0) {
    // gzread returns 0 both at a clean end and at a truncated gzip member; gzerror tells them apart.
    int err = 0;
    ::gzerror(gz_, &err);
    if (err == Z_BUF_ERROR) throw ParseError{consumed_, "unexpected end of input (truncated gzip stream)"};
    eof_ = true;
    return false;
  }
  end_ = static_cast<size_t>(n);
  return true;
}

int JsonScanner::peek() {
  for (;;) {
    while (pos_ < end_) {
      const int c = static_cast<unsigned char>(buf_[pos_]);
      if (!is_ws(c)) return c;
      ++pos_;
    }
    if (!fill()) return -1;
  }
}

bool JsonScanner::accept(char c) {
  if (peek() == static_cast<unsigned char>(c)) {
    ++pos_;
    return true;
  }
  return false;
}

void JsonScanner::expect(char c, const char* what) {
  const int got = peek();
  if (got == static_cast<unsigned char>(c)) {
    ++pos_;
    return;
  }
  if (got < 0) fail(fmt::format("unexpected end of input (expected {})", what));
  if (got >= 0x20 && got < 0x7f) fail(fmt::format("expected {} but found '{}'", what, static_cast<char>(got)));
  fail(fmt::format("expected {} but found byte 0x{:02x}", what, got));
}

// Copies a UTF-8 multi-byte sequence after its lead byte; invalid sequences become U+FFFD (repaired).
bool JsonScanner::read_utf8_tail(unsigned char lead, std::string& out) {
  int need = lead >= 0xF0 && lead <= 0xF4 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC2 && lead <= 0xDF ? 1 : -1;
  if (need < 0) {
    out += "\xEF\xBF\xBD";
    return true;
  }
  char seq[4] = {static_cast<char>(lead)};
  for (int i = 1; i <= need; ++i) {
    if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
    const unsigned char c = static_cast<unsigned char>(buf_[pos_]);
    if ((c & 0xC0) != 0x80) {  // leave the byte for the caller: it may be the closing quote
      out += "\xEF\xBF\xBD";
      return true;
    }
    seq[i] = static_cast<char>(c);
    ++pos_;
  }
  out.append(seq, static_cast<size_t>(need + 1));
  return false;
}

bool JsonScanner::read_string(std::string& out) {
  out.clear();
  expect('"', "a string");
  bool repaired = false;
  for (;;) {
    if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
    // Fast path: copy the run of ordinary bytes in one append.
    size_t run = pos_;
    while (run < end_) {
      const unsigned char c = static_cast<unsigned char>(buf_[run]);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
      ++run;
    }
    out.append(buf_ + pos_, run - pos_);
    pos_ = run;
    if (pos_ == end_) continue;
    const unsigned char c = static_cast<unsigned char>(buf_[pos_++]);
    if (c == '"') return repaired;
    if (c == '\\') {
      if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
      const char e = buf_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = 0;
          int got = 0;
          for (; got < 4; ++got) {
            if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
            const char h = buf_[pos_];
            const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) break;
            cp = cp * 16 + static_cast<unsigned>(v);
            ++pos_;
          }
          if (got < 4 || (cp >= 0xD800 && cp <= 0xDFFF)) {  // bad or lone surrogate: keep a replacement char
            out += "\xEF\xBF\xBD";
            repaired = true;
          } else if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:  // an unescaped backslash ("C:\path"): keep it literally
          out += '\\';
          out += e;
          repaired = true;
      }
    } else if (c < 0x20) {  // raw control character or newline: keep a space so names stay one line
      out += ' ';
      repaired = true;
    } else {
      repaired |= read_utf8_tail(c, out);
    }
  }
}

bool JsonScanner::skip_string_body() {
  bool repaired = false;
  for (;;) {
    if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
    const void* q = std::memchr(buf_ + pos_, '"', end_ - pos_);
    const size_t stop = q ? static_cast<size_t>(static_cast<const char*>(q) - buf_) : end_;
    // A quote preceded by an odd number of backslashes is escaped; scan the run for backslashes.
    size_t i = pos_;
    bool escaped = false;
    for (; i < stop; ++i) {
      const unsigned char c = static_cast<unsigned char>(buf_[i]);
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c < 0x20) repaired = true;
    }
    if (!q) {
      pos_ = end_;
      if (escaped) {  // the escaped char is the first of the next buffer
        if (!fill()) fail("unexpected end of input inside a string");
        ++pos_;
      }
      continue;
    }
    pos_ = stop + 1;
    if (!escaped) return repaired;
  }
}

bool JsonScanner::read_number(NumberText& out) {
  out.len = 0;
  int c = peek();
  if (c == '"') {
    ++pos_;
    // A number written as a string (Ascend's ts): read up to the closing quote.
    for (;;) {
      if (pos_ == end_ && !fill()) fail("unexpected end of input inside a string");
      const char ch = buf_[pos_++];
      if (ch == '"') break;
      if (ch == '\\') {
        pos_--;
        skip_string_body();
        out.len = 0;
        return false;
      }
      if (static_cast<size_t>(out.len) + 1 < sizeof(out.text)) out.text[out.len++] = ch;
      else out.len = sizeof(out.text);  // too long to be a timestamp
    }
    if (static_cast<size_t>(out.len) >= sizeof(out.text)) {
      out.len = 0;
      return false;
    }
    out.text[out.len] = 0;
    int64_t dummy;
    if (!number_to_ns(out, dummy)) {
      out.len = 0;
      return false;
    }
    return true;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    for (;;) {
      if (pos_ == end_ && !fill()) break;
      const char ch = buf_[pos_];
      if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '+' || ch == 'e' || ch == 'E')) break;
      if (static_cast<size_t>(out.len) + 1 >= sizeof(out.text)) fail("number too long");
      out.text[out.len++] = ch;
      ++pos_;
    }
    out.text[out.len] = 0;
    return true;
  }
  skip_value();
  return false;
}

void JsonScanner::skip_value() {
  // Iterative, so hostile nesting cannot overflow the stack.
  int depth = 0;
  for (;;) {
    const int c = peek();
    if (c < 0) fail("unexpected end of input");
    if (c == '"') {
      ++pos_;
      skip_string_body();
    } else if (c == '{' || c == '[') {
      ++pos_;
      if (++depth > kMaxDepth) fail("nesting too deep");
      continue;  // the first element may follow directly, or the container is empty
    } else if (c == '}' || c == ']') {
      if (depth == 0) fail(fmt::format("unexpected '{}'", static_cast<char>(c)));
      ++pos_;
      --depth;
    } else if (c == ',' || c == ':') {
      if (depth == 0) fail(fmt::format("unexpected '{}'", static_cast<char>(c)));
      ++pos_;
      continue;
    } else {
      // number, true/false/null: consume the token
      bool any = false;
      for (;;) {
        if (pos_ == end_ && !fill()) break;
        const char ch = buf_[pos_];
        if (ch == ',' || ch == '}' || ch == ']' || ch == ':' || is_ws(ch) || ch == '"') break;
        ++pos_;
        any = true;
      }
      if (!any) fail("unexpected character");
    }
    if (depth == 0) return;
  }
}

void JsonScanner::resync_event() {
  bool at_line_start = false;
  for (;;) {
    if (pos_ == end_ && !fill()) fail("unexpected end of input while skipping a malformed event");
    const char c = buf_[pos_];
    if (c == '\n') {
      at_line_start = true;
    } else if (at_line_start && (c == '{' || c == ']')) {
      return;
    } else if (!is_ws(c)) {
      at_line_start = false;
    }
    ++pos_;
  }
}

}  // namespace coc::analysis::detail
