#include "data/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) test vectors and the standard check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, HardwareMatchesTableOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(300);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; start + n <= buf.size(); n += 7) {
      EXPECT_EQ(Crc32c(buf.data() + start, n), Crc32cPortable(0, buf.data() + start, n))
          << "start " << start << " n " << n;
    }
  }
}

TEST(Crc32cTest, HardwareMatchesTableOnLongBuffers) {
  // Long enough for the three-way interleaved paths (3 x 8192 and 3 x 256).
  std::mt19937 rng(9);
  std::vector<uint8_t> buf(100000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{767}, size_t{768}, size_t{24575}, size_t{24576}, size_t{24577},
                   size_t{50000}, size_t{99990}}) {
    for (size_t start : {size_t{0}, size_t{3}}) {
      EXPECT_EQ(Crc32c(0x1234u, buf.data() + start, n),
                Crc32cPortable(0x1234u, buf.data() + start, n))
          << "n " << n << " start " << start;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    uint32_t part = Crc32c(Crc32c(s.data(), cut), s.data() + cut, s.size() - cut);
    EXPECT_EQ(part, Crc32c(s.data(), s.size()));
  }
}

}  // namespace
}  // namespace recfleet::data
