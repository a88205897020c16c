// Bytes made safe to print: user files and model output may hold any byte, and raw control bytes in a message or on
// a terminal break lines, move the cursor or garble the screen.
#pragma once

#include <string>
#include <string_view>

namespace coc {

/// `bytes` with printable ASCII and well-formed UTF-8 characters kept (Chinese or accented text stays readable; C1
/// controls, overlong forms, surrogates and stray bytes do not pass) and every other byte written as \xNN. With
/// keep_newlines, '\n' and '\t' pass too (multi-line text such as a generated sample); without, the result is one
/// line (for error messages).
std::string printable(std::string_view bytes, bool keep_newlines);

}  // namespace coc
