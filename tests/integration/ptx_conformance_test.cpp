// The PTX conformance suite (tests/programs/ptx_conformance.cpp) through the stub and a real
// daemon on the sim: every instruction class's results equal the CPU reference, for the PTX nvcc
// emits optimised and with -G.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::testing {
namespace {

void expectConformance(const std::vector<std::string>& arguments) {
  Daemon daemon;
  const RunResult result = daemon.runClient("ptx_conformance", arguments);
  EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.log();
  EXPECT_NE(result.output.find("PASSED"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("MISMATCH"), std::string::npos) << result.output;
}

TEST(PtxConformance, OptimisedPtxMatchesTheCpuReference) {
  expectConformance({});
}

TEST(PtxConformance, DebugPtxMatchesTheCpuReference) {
  expectConformance({"--debug"});
}

}  // namespace
}  // namespace gpuproxy::testing
