// The stub's Cap'n Proto, kj and C++ runtime are private: a program with its own shared copies
// (own_runtime_probe, linked against Debian's libkj, libcapnp and libstdc++) uses both side by
// side, each its own, and gets the GPU's results.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

TEST(PrivateRuntime, AProgramWithItsOwnCapnProtoAndLibstdcxxRunsThroughTheStub) {
  Daemon daemon;
  RunResult result = daemon.runClient("own_runtime_probe");
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << "\ndaemon:\n"
                                           << daemon.log();
  EXPECT_NE(result.output.find("own_runtime_probe: OK"), std::string::npos) << result.output;
  // Both were loaded: the program's own libraries and the stub.
  EXPECT_NE(result.output.find("libkj-0.9.2.so"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("libcapnp-0.9.2.so"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("libstdc++.so.6"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(stubDirectory() + "/libcuda.so.1"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace gpuproxy::testing
