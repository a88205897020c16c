// printable (coc/core/printable.h): ASCII and well-formed UTF-8 text pass, control and stray bytes are escaped.
#include <gtest/gtest.h>

#include <string>

#include "coc/core/printable.h"

namespace coc {
namespace {

TEST(Printable, KeepsUtf8Text) {
  EXPECT_EQ(printable("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80", false),
            "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80");  // café 中文 😀
  EXPECT_EQ(printable("a\nb\tc", true), "a\nb\tc");
  EXPECT_EQ(printable("a\nb", false), "a\\x0ab");
}

TEST(Printable, EscapesWhatIsNotText) {
  EXPECT_EQ(printable("\x1b[2J", true), "\\x1b[2J");                   // a terminal escape
  EXPECT_EQ(printable("\xc2\x9b", true), "\\xc2\\x9b");                // C1 control (CSI)
  EXPECT_EQ(printable("\xc0\xaf", true), "\\xc0\\xaf");                // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80", true), "\\xed\\xa0\\x80");       // a surrogate
  EXPECT_EQ(printable("\xe4\xb8", true), "\\xe4\\xb8");                // truncated sequence
  EXPECT_EQ(printable("\xff", true), "\\xff");
}

}  // namespace
}  // namespace coc
