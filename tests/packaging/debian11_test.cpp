// The stub as shipped, in an image older than the build machine: a Debian 11 root filesystem
// (glibc 2.31, GCC 10's libstdc++, no Cap'n Proto), made once by debootstrap
// (packaging_debian11_rootfs). Programs run there with chroot, through build/lib/gpuproxy mounted
// read-only, against a daemon running outside, as a container's programs would.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

std::string rootFilesystem() {
  return buildDir() + "/test-rootfs/debian11";
}

std::string describe(const RunResult& result, const Daemon& daemon) {
  return "stdout:\n" + result.output + "\nstderr:\n" + result.errors + "\ndaemon:\n" + daemon.log();
}

class Debian11 : public ::testing::Test {
protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: chroot and a mount namespace";
    if (!std::filesystem::exists(rootFilesystem() + "/.gpuproxy-complete")) {
      std::ifstream reason(rootFilesystem() + ".unavailable");
      std::stringstream text;
      text << reason.rdbuf();
      GTEST_SKIP() << "the Debian 11 root filesystem is not there ("
                   << (text.str().empty() ? "packaging_debian11_rootfs has not run" : text.str())
                   << ")";
    }
    RunResult probe = run({"/usr/bin/unshare", "--mount", "/bin/true"});
    if (!probe.status.exitedWith(0)) {
      GTEST_SKIP() << "cannot make a mount namespace here: " << probe.errors;
    }
  }

  // Runs build/tests/programs/<program> in the root filesystem through the stub, against `daemon`.
  static RunResult runThere(const Daemon& daemon, const std::string& program,
                            std::vector<std::string> arguments) {
    std::vector<std::string> argv = {
        GPUPROXY_RUN_IN_ROOTFS, rootFilesystem(), stubDirectory(),
        std::filesystem::path(daemon.socketPath()).parent_path().string(), programBinary(program)};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    std::map<std::string, std::string> environment = {
        {"GPUPROXY_SOCKET", daemon.socketPath()},
        {"GPUPROXY_ROOTFS_BIND", GPUPROXY_CUDA_LIBRARY_DIR}};
    if (rpcTransport()) environment["GPUPROXY_TRANSPORT"] = "rpc";
    return run(std::move(argv), std::move(environment), std::chrono::seconds(120));
  }
};

TEST_F(Debian11, TheRootFilesystemIsOlderThanTheBuildMachine) {
  // What makes the other tests mean something: glibc 2.31 and no Cap'n Proto there.
  EXPECT_TRUE(std::filesystem::exists(rootFilesystem() + "/lib/x86_64-linux-gnu/libc-2.31.so"));
  EXPECT_FALSE(
      std::filesystem::exists(rootFilesystem() + "/usr/lib/x86_64-linux-gnu/libkj-0.9.2.so"));
  // A program built for the build machine does not even start there.
  Daemon daemon;
  RunResult result = runThere(daemon, "vector_add", {"--elements", "1024"});
  EXPECT_FALSE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.errors.find("version `GLIBC_2.34' not found"), std::string::npos)
      << result.errors;
}

TEST_F(Debian11, ADriverApiProgramRunsThroughTheShippedStub) {
  Daemon daemon;
  RunResult result = runThere(daemon, "portable/vector_add", {"--elements", "100000"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("vector_add: OK (100000 elements"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("gpuproxy sim device 0"), std::string::npos) << result.output;
}

// cudart linked statically (nvcc's default), and shared: libcudart.so from the toolkit's library
// directory, mounted at the same path, as a CUDA image has it (it needs only GLIBC_2.17).
class Debian11Cudart : public Debian11, public ::testing::WithParamInterface<const char*> {};

TEST_P(Debian11Cudart, AnNvccBuiltRuntimeProgramRunsThroughTheShippedStub) {
  Daemon daemon;
  const std::string program = std::string("portable/cudart_checks_") + GetParam();
  for (const char* mode : {"vectors", "streams", "pinned"}) {
    RunResult result = runThere(daemon, program, {mode});
    EXPECT_TRUE(result.status.exitedWith(0)) << mode << "\n" << describe(result, daemon);
    EXPECT_NE(result.output.find(std::string(mode) + ": PASSED"), std::string::npos)
        << result.output;
  }
  // Everything the programs held came back when they exited.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  }));
}

INSTANTIATE_TEST_SUITE_P(Cudart, Debian11Cudart, ::testing::Values("static", "shared"));

}  // namespace
}  // namespace gpuproxy::testing
