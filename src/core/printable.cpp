#include "coc/core/printable.h"

#include <fmt/format.h>

#include <cstdint>

namespace coc {

namespace {
/// The length of the well-formed UTF-8 sequence of a printable character at the start of `s` (RFC 3629: no overlong
/// forms, no surrogates, at most U+10FFFF; the C1 controls U+0080..U+009F excluded), or 0.
size_t utf8_char_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3f);
  }
  const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f) return 0;
  return n;
}
}  // namespace

std::string printable(std::string_view bytes, bool keep_newlines) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char ch = static_cast<unsigned char>(bytes[i]);
    if ((ch >= 0x20 && ch < 0x7f) || (keep_newlines && (ch == '\n' || ch == '\t'))) {
      out.push_back(static_cast<char>(ch));
      ++i;
    } else if (const size_t n = ch >= 0x80 ? utf8_char_length(bytes.substr(i)) : 0; n > 0) {
      out.append(bytes.substr(i, n));  // a whole UTF-8 character: text in any script stays readable
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", ch);
      ++i;
    }
  }
  return out;
}

}  // namespace coc
