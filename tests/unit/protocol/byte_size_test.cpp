#include "protocol/byte_size.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::protocol {
namespace {

TEST(ParseByteSize, PlainNumbersAreBytes) {
  EXPECT_EQ(parseByteSize("0"), 0u);
  EXPECT_EQ(parseByteSize("1048576"), 1048576u);
}

TEST(ParseByteSize, BinarySuffixesArePowersOf1024) {
  EXPECT_EQ(parseByteSize("16GiB"), 16ull << 30);
  EXPECT_EQ(parseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(parseByteSize("4KiB"), 4096u);
  EXPECT_EQ(parseByteSize("1TiB"), 1ull << 40);
  EXPECT_EQ(parseByteSize("16gib"), 16ull << 30);
  EXPECT_EQ(parseByteSize("16 GiB"), 16ull << 30);
}

TEST(ParseByteSize, DecimalSuffixesArePowersOf1000) {
  EXPECT_EQ(parseByteSize("4GB"), 4'000'000'000u);
  EXPECT_EQ(parseByteSize("4G"), 4'000'000'000u);
  EXPECT_EQ(parseByteSize("3k"), 3000u);
  EXPECT_EQ(parseByteSize("7B"), 7u);
}

TEST(ParseByteSize, RejectsGarbageAndOverflow) {
  EXPECT_FALSE(parseByteSize(""));
  EXPECT_FALSE(parseByteSize("GiB"));
  EXPECT_FALSE(parseByteSize("-1"));
  EXPECT_FALSE(parseByteSize("1.5GiB"));
  EXPECT_FALSE(parseByteSize("12 parsecs"));
  EXPECT_FALSE(parseByteSize("16GiB "));
  EXPECT_FALSE(parseByteSize("99999999999999999999"));
  EXPECT_FALSE(parseByteSize("17179869184TiB"));
  EXPECT_EQ(parseByteSize("18446744073709551615"), UINT64_MAX);
}

TEST(FormatByteSize, PicksTheLargestFittingUnit) {
  EXPECT_EQ(formatByteSize(512), "512 B");
  EXPECT_EQ(formatByteSize(16ull << 30), "16.0 GiB");
  EXPECT_EQ(formatByteSize(3ull << 19), "1.5 MiB");
}

}  // namespace
}  // namespace gpuproxy::protocol
