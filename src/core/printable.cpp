#include "coc/core/printable.h"

#include <fmt/format.h>

namespace coc {

std::string printable(std::string_view bytes, bool keep_newlines) {
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char ch : bytes) {
    if ((ch >= 0x20 && ch < 0x7f) || (keep_newlines && (ch == '\n' || ch == '\t')))
      out.push_back(static_cast<char>(ch));
    else
      out += fmt::format("\\x{:02x}", ch);
  }
  return out;
}

}  // namespace coc
