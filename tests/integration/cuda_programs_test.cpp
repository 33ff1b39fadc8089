// CUDA programs written the way people write CUDA (tests/programs/: reductions, a scan, a
// histogram, a tiled matrix multiply, a sorting network, templated kernels, __constant__ tables,
// device printf, an out-of-bounds write) run unmodified through the stub and a real daemon on the
// sim, and print the same results as their CPU reference.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace gpuproxy::testing {
namespace {

class CudaPrograms : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPrograms, PrintTheCpuReferenceResults) {
  Daemon daemon;
  const std::string& program = GetParam();
  const RunResult result = daemon.runClient(program);
  EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.log();
  EXPECT_NE(result.output.find(program + ": PASSED"), std::string::npos)
      << result.output << result.errors;
}

INSTANTIATE_TEST_SUITE_P(Examples, CudaPrograms,
                         ::testing::Values("reduce", "scan", "histogram", "matmul", "bitonic_sort",
                                           "templates", "constant_table", "printf_hello",
                                           "out_of_bounds"));

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// What each thread printed reaches the application's stdout before the synchronisation after its
// launch returns: between the program's own "before" and "after" lines.
TEST(DevicePrintf, ReachesStdoutAtTheNextSynchronisation) {
  if (chainedCudaBackend()) {
    GTEST_SKIP() << "the cuda backend leaves device printf to the driver, which writes it to "
                    "gpuproxyd's stdout (README, \"The cuda backend\")";
  }
  Daemon daemon;
  const RunResult result = daemon.runClient("printf_hello");
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.log();
  const std::vector<std::string> output = lines(result.output);
  for (int launch = 0; launch < 2; ++launch) {
    const auto before =
        std::find(output.begin(), output.end(), "before launch " + std::to_string(launch));
    const auto after =
        std::find(output.begin(), output.end(), "after launch " + std::to_string(launch));
    ASSERT_NE(before, output.end()) << result.output;
    ASSERT_NE(after, output.end()) << result.output;
    std::vector<std::string> printed(before + 1, after);
    std::sort(printed.begin(), printed.end());
    std::vector<std::string> expected;
    for (int block = 0; block < 2; ++block) {
      for (int thread = 0; thread < 3; ++thread) {
        const int t = block * 3 + thread;
        char line[200];
        std::snprintf(line, sizeof line, "launch %d, block %d, thread %d: %s %5.2f %lld %c 0x%x%%",
                      launch, block, thread, t % 2 == 0 ? "even" : "odd", t * 0.25,
                      static_cast<long long>(t) << 33, 'a' + t % 26, t * 255);
        expected.emplace_back(line);
      }
    }
    EXPECT_EQ(printed, expected) << result.output;
  }
}

// The fault names the client, the kernel and the address in the daemon's log.
TEST(OutOfBounds, TheLogNamesTheKernelAndTheAddress) {
  Daemon daemon;
  const RunResult result = daemon.runClient("out_of_bounds");
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
  const std::string log = daemon.log();
  EXPECT_NE(log.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << log;
  EXPECT_NE(log.find("a kernel of pid"), std::string::npos) << log;
  // Which kernel and which access: the sim knows; a driver reports the error alone.
  if (chainedCudaBackend()) return;
  EXPECT_NE(log.find("kernel 'fill_past_the_end'"), std::string::npos) << log;
  EXPECT_NE(log.find("store of 4 bytes to global address"), std::string::npos) << log;
}

}  // namespace
}  // namespace gpuproxy::testing
