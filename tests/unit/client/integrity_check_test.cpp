// The answer to the CUDA runtime's integrity check: MD2 as RFC 1319 defines it, and an HMAC over
// everything the runtime mixes in, so that no input can change without changing the answer.
// (That the runtime accepts the answer is shown end to end by integration_cudart_programs_test.)

#include "client/stub/integrity_check.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace gpuproxy::stub {
namespace {

std::string md2Hex(const std::string& message) {
  Md2 md2;
  md2.update(message.data(), message.size());
  std::string hex;
  for (std::uint8_t byte : md2.finish()) {
    char digits[3];
    std::snprintf(digits, sizeof(digits), "%02x", byte);
    hex += digits;
  }
  return hex;
}

TEST(Md2, MatchesTheTestSuiteOfRfc1319) {
  EXPECT_EQ(md2Hex(""), "8350e5a3e24c153df2275c9f80692773");
  EXPECT_EQ(md2Hex("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  EXPECT_EQ(md2Hex("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
  EXPECT_EQ(md2Hex("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
  EXPECT_EQ(md2Hex("abcdefghijklmnopqrstuvwxyz"), "4e8ddff3650292ab5a4108c3aa47940b");
  EXPECT_EQ(md2Hex("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "da33def2a42df13975352846c30338cd");
  EXPECT_EQ(md2Hex("123456789012345678901234567890123456789012345678901234567890123456789012345"
                   "67890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST(Md2, FeedingInPiecesIsFeedingAtOnce) {
  const std::string message = "the quick brown fox jumps over the lazy dog, twice over";
  Md2 pieces;
  for (std::size_t i = 0; i < message.size(); i += 7) {
    pieces.update(message.data() + i, std::min<std::size_t>(7, message.size() - i));
  }
  Md2 whole;
  whole.update(message.data(), message.size());
  EXPECT_EQ(pieces.finish(), whole.finish());
}

IntegrityInputs sampleInputs() {
  static int tables[3];
  IntegrityInputs inputs;
  inputs.driverVersion = 13000;
  inputs.runtimeVersion = 13002;
  inputs.processId = 4242;
  inputs.threadId = 0x5eed;
  inputs.cudartTable = &tables[0];
  inputs.integrityTable = &tables[1];
  inputs.checkFunction = &tables[2];
  inputs.timestamp = 1'790'000'000;
  return inputs;
}

std::vector<IntegrityDevice> sampleDevices() {
  IntegrityDevice first;
  first.uuid = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  first.pciBus = 0x17;
  IntegrityDevice second = first;
  second.uuid[0] = 99;
  second.pciBus = 0x65;
  return {first, second};
}

TEST(IntegrityCheck, VersionsEndingInZeroOrOneExpectTheirFixedAnswers) {
  IntegrityInputs inputs = sampleInputs();
  inputs.runtimeVersion = 13000;
  const auto zero = integrityCheckAnswer(inputs, sampleDevices());
  inputs.runtimeVersion = 13001;
  const auto one = integrityCheckAnswer(inputs, sampleDevices());
  EXPECT_NE(zero, one);
  // Fixed: nothing else matters.
  inputs.processId = 1;
  inputs.timestamp = 2;
  EXPECT_EQ(integrityCheckAnswer(inputs, {}), one);
}

TEST(IntegrityCheck, EveryInputChangesTheAnswer) {
  const auto devices = sampleDevices();
  const auto reference = integrityCheckAnswer(sampleInputs(), devices);
  EXPECT_EQ(integrityCheckAnswer(sampleInputs(), devices), reference);  // deterministic

  std::vector<IntegrityInputs> variants(8, sampleInputs());
  variants[0].driverVersion += 10;
  variants[1].runtimeVersion += 10;
  variants[2].processId += 1;
  variants[3].threadId += 1;
  variants[4].cudartTable = nullptr;
  variants[5].integrityTable = nullptr;
  variants[6].checkFunction = nullptr;
  variants[7].timestamp += 1;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(integrityCheckAnswer(variants[i], devices), reference) << "input " << i;
  }
  auto swapped = devices;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(integrityCheckAnswer(sampleInputs(), swapped), reference);
  auto moved = devices;
  moved[1].pciDevice = 1;
  EXPECT_NE(integrityCheckAnswer(sampleInputs(), moved), reference);
  EXPECT_NE(integrityCheckAnswer(sampleInputs(), std::span(devices).first(1)), reference);
}

}  // namespace
}  // namespace gpuproxy::stub
