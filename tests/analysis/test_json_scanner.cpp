// The tolerant lexer under the trace readers: exact ns from decimal µs, string repair, skipping, truncation.
#include <gtest/gtest.h>

#include <cstring>

#include "../../src/analysis/json_scanner.h"
#include "support/temp_dir.h"
#include "trace_test_util.h"

using coc::analysis::detail::JsonScanner;
using coc::analysis::detail::NumberText;
using coc::analysis::detail::ParseError;

namespace {

NumberText num(const char* s) {
  NumberText n;
  n.len = static_cast<uint8_t>(std::strlen(s));
  std::memcpy(n.text, s, n.len);
  return n;
}

TEST(JsonScanner, DecimalMicrosecondsToExactNanoseconds) {
  int64_t ns = 0;
  ASSERT_TRUE(number_to_ns(num("1704161511422904.204"), ns));
  EXPECT_EQ(ns, 1704161511422904204);  // Ascend string ts: no double rounding
  ASSERT_TRUE(number_to_ns(num("12.5"), ns));
  EXPECT_EQ(ns, 12500);
  ASSERT_TRUE(number_to_ns(num("0.0004"), ns));
  EXPECT_EQ(ns, 0);
  ASSERT_TRUE(number_to_ns(num("0.0005"), ns));
  EXPECT_EQ(ns, 1);
  ASSERT_TRUE(number_to_ns(num("-3.25"), ns));
  EXPECT_EQ(ns, -3250);
  ASSERT_TRUE(number_to_ns(num("1.5e3"), ns));
  EXPECT_EQ(ns, 1'500'000);
  EXPECT_FALSE(number_to_ns(num("abc"), ns));
  int64_t v = 0;
  ASSERT_TRUE(number_to_int(num("12884901888"), v));  // pid above 2^32
  EXPECT_EQ(v, 12884901888);
  EXPECT_FALSE(number_to_int(num("99999999999999999999"), v));
}

TEST(JsonScanner, RepairsMalformedStringsAndSkipsValues) {
  coc::test::TempDir d("coc_scan");
  coc::test::write_file(d / "s.json", "[\"ok\", \"a\\qb\", \"tab\there\", \"\xc3\xa9\", \"\xff\", \"\\u00e9\\ud800\", "
                                      "{\"x\": [1, {\"y\": \"\\\"}\"}], \"z\": null}, \"1704161511422904.204\"]");
  JsonScanner sc(d / "s.json");
  std::string s;
  sc.expect('[', "[");
  EXPECT_FALSE(sc.read_string(s));
  EXPECT_EQ(s, "ok");
  sc.expect(',', ",");
  EXPECT_TRUE(sc.read_string(s));  // unknown escape kept literally
  EXPECT_EQ(s, "a\\qb");
  sc.expect(',', ",");
  EXPECT_TRUE(sc.read_string(s));  // raw control character
  EXPECT_EQ(s, "tab here");
  sc.expect(',', ",");
  EXPECT_FALSE(sc.read_string(s));  // valid UTF-8 kept
  EXPECT_EQ(s, "\xc3\xa9");
  sc.expect(',', ",");
  EXPECT_TRUE(sc.read_string(s));  // invalid byte replaced
  EXPECT_EQ(s, "\xEF\xBF\xBD");
  sc.expect(',', ",");
  EXPECT_TRUE(sc.read_string(s));  // lone surrogate replaced
  EXPECT_EQ(s, "\xc3\xa9\xEF\xBF\xBD");
  sc.expect(',', ",");
  sc.skip_value();  // nested object with an escaped quote and brace inside a string
  sc.expect(',', ",");
  NumberText n;
  ASSERT_TRUE(sc.read_number(n));  // a number written as a string
  EXPECT_STREQ(n.text, "1704161511422904.204");
  sc.expect(']', "]");
  EXPECT_EQ(sc.peek(), -1);
}

TEST(JsonScanner, TruncationReportsTheOffset) {
  coc::test::TempDir d("coc_scan");
  coc::test::write_file(d / "t.json", "[\"unterminated");
  JsonScanner sc(d / "t.json");
  sc.expect('[', "[");
  std::string s;
  try {
    sc.read_string(s);
    FAIL() << "expected a ParseError";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.offset, 14u);
    EXPECT_NE(e.message.find("unexpected end of input"), std::string::npos);
  }
}

}  // namespace
