// printable() (pinned/internal/conveyor/internal/printable.h; issue 29): a string from data
// quoted in a message is bounded (cut with its whole length said) and escaped (controls, invalid
// UTF-8, and the characters terminals act on), while names in any language stay readable.
#include <gtest/gtest.h>

#include <string>

#include "conveyor/internal/printable.h"

namespace conveyor::detail {
namespace {

TEST(Printable, PlainTextAndValidUtf8AreShownAsThey) {
  EXPECT_EQ(printable("n01440764/ILSVRC2012_val_00000293.JPEG"),
            "n01440764/ILSVRC2012_val_00000293.JPEG");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\x88"),
            "caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\x88");
  EXPECT_EQ(printable(""), "");
}

TEST(Printable, ControlsAreEscapedSoANameCannotFakeALogLine) {
  EXPECT_EQ(printable("a\nconveyor: all good\r\t\\"), "a\\nconveyor: all good\\r\\t\\\\");
  EXPECT_EQ(printable(std::string("\x1b[2J\x7f\0z", 7)), "\\x1b[2J\\x7f\\x00z");
}

TEST(Printable, InvalidUtf8AndCharactersTerminalsActOnAreEscaped) {
  EXPECT_EQ(printable("\xff"), "\\xff");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");             // overlong '/'
  EXPECT_EQ(printable("\x80x"), "\\x80x");                    // a lone continuation
  EXPECT_EQ(printable("\xe7\x8c"), "\\xe7\\x8c");             // cut short
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");    // a surrogate
  EXPECT_EQ(printable("\xc2\x9b"), "\\xc2\\x9b");             // C1 control (CSI)
  EXPECT_EQ(printable("\xe2\x80\xae"), "\\xe2\\x80\\xae");    // right-to-left override
  EXPECT_EQ(printable("a\xe2\x80\xa8"), "a\\xe2\\x80\\xa8");  // line separator
  EXPECT_EQ(printable("\xe2\x81\xa6"), "\\xe2\\x81\\xa6");    // left-to-right isolate
  EXPECT_EQ(printable("\xe2\x80\x94"), "\xe2\x80\x94");       // an em dash is text
}

TEST(Printable, ALongTextIsCutWithItsLengthAndTheResultIsBounded) {
  const std::string huge(size_t{64} << 20, 'x');
  const std::string shown = printable(huge);
  EXPECT_EQ(shown, std::string(200, 'x') + "... (67108864 bytes)");
  EXPECT_EQ(printable("abcdef", 3), "abc... (6 bytes)");
  EXPECT_EQ(printable("abc", 3), "abc");
  // Escapes at most quadruple the bytes shown.
  const std::string controls(1000, '\x01');
  EXPECT_LE(printable(controls).size(), 4 * 200 + 32);
}

TEST(Printable, ACutNeverSplitsAUtf8Character) {
  std::string accents;
  for (int i = 0; i < 10; ++i) accents += "\xc3\xa9";  // 20 bytes
  EXPECT_EQ(printable(accents, 5), "\xc3\xa9\xc3\xa9... (20 bytes)");
}

}  // namespace
}  // namespace conveyor::detail
