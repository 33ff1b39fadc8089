// Client mistakes get the error the real driver gives, and the daemon keeps serving.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace gpuproxy::testing {
namespace {

// error_probe prints "<check> <CUresult name>" per line.
class ErrorPaths : public ::testing::Test {
protected:
  std::map<std::string, std::string> probe(const std::string& scenario,
                                           std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), scenario);
    RunResult result = daemon_.runClient("error_probe", extra);
    EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
    return answers(result.output);
  }
  void expectDaemonStillServes() {
    RunResult result = daemon_.runClient("vector_add", {"--elements", "1024"});
    EXPECT_TRUE(result.status.exitedWith(0)) << result.errors << daemon_.log();
  }
  Daemon daemon_;
};

TEST(ErrorPathsWithoutDaemon, InitSaysNoDeviceAndNamesTheSocket) {
  TempDir directory;
  std::string socket = directory.file("nobody-home.sock");
  RunResult result = run({programBinary("error_probe"), "init"},
                         {{"LD_LIBRARY_PATH", stubDirectory()}, {"GPUPROXY_SOCKET", socket}});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors;
  auto got = answers(result.output);
  EXPECT_EQ(got["cuInit"], "CUDA_ERROR_NO_DEVICE");
  EXPECT_EQ(got["cuDeviceGet"], "CUDA_ERROR_NOT_INITIALIZED");
  EXPECT_NE(result.errors.find(socket), std::string::npos) << result.errors;
}

TEST_F(ErrorPaths, BadHandlesAreInvalidHandle) {
  auto got = probe("bad-handle");
  EXPECT_EQ(got["cuStreamSynchronize"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuModuleGetFunction"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuEventQuery"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuStreamDestroy"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuEventCreate"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuStreamQuery(event)"], "CUDA_ERROR_INVALID_HANDLE");
  expectDaemonStillServes();
}

TEST_F(ErrorPaths, CopiesPastTheEndOfAnAllocationAreInvalidValue) {
  auto got = probe("copy-past-end");
  EXPECT_EQ(got["cuMemAlloc"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuMemcpyHtoD"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyDtoH"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemsetD32"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyHtoD(in bounds)"], "CUDA_SUCCESS");
  expectDaemonStillServes();
}

TEST_F(ErrorPaths, FreedMemoryIsInvalidValue) {
  auto got = probe("freed-memory");
  EXPECT_EQ(got["cuMemFree"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuMemFree(again)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyHtoD(freed)"], "CUDA_ERROR_INVALID_VALUE");
}

TEST_F(ErrorPaths, UnknownKernelsAndUnrunnableModulesAreRefused) {
  auto got = probe("unknown-kernel");
  EXPECT_EQ(got["cuModuleLoadData"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuModuleGetFunction"], "CUDA_ERROR_NOT_FOUND");
  EXPECT_EQ(got["cuModuleLoadData(garbage)"], "CUDA_ERROR_INVALID_IMAGE");
  if (chainedCudaBackend()) {
    GTEST_SKIP() << "what the sim cannot run is the sim's to refuse; the cuda backend hands every "
                    "module to the driver";
  }
  // Valid PTX the sim's interpreter does not execute: refused at load, naming what and where.
  EXPECT_EQ(got["cuModuleLoadData(texture)"], "CUDA_ERROR_NOT_SUPPORTED");
  EXPECT_NE(daemon_.log().find("texture_kernel"), std::string::npos) << daemon_.log();
  EXPECT_NE(daemon_.log().find("tex.2dms.v4.f32.s32"), std::string::npos) << daemon_.log();
  EXPECT_EQ(got["cuModuleLoadData(malformed)"], "CUDA_ERROR_INVALID_PTX");
  expectDaemonStillServes();
}

// Kernels nvcc built from ordinary CUDA C++ that use sparse textures, surface reductions, 4-bit
// tensor cores or clusters: cuModuleLoadData fails with NOT_SUPPORTED (never a load that
// would run with a wrong answer), and the daemon's log names the first such instruction and its
// kernel.
TEST_F(ErrorPaths, KernelsTheSimCannotRunAreRefusedAtLoadByName) {
  if (chainedCudaBackend()) {
    GTEST_SKIP() << "what the sim cannot run is the sim's to refuse; the cuda backend hands every "
                    "module to the driver";
  }
  auto got = probe("unsupported-kernels");
  const std::pair<std::string, std::string> refused[] = {
      {"texture_sample", "'tex.2d.v4.f32.f32' (texture residency predicates (sparse))"},
      {"surface_write", "'sured.b.add.2d.u32.trap' (surface reductions and texture type tests)"},
      {"tensor_core_tile",
       "'mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32' (tensor-core instructions of sub-byte "
       "types)"},
      {"cluster_exchange", "uses .explicitcluster"},
  };
  const std::string log = daemon_.log();
  for (const auto& [kernel, what] : refused) {
    SCOPED_TRACE(kernel);
    EXPECT_EQ(got["cuModuleLoadData(" + kernel + ")"], "CUDA_ERROR_NOT_SUPPORTED");
    std::istringstream lines(log);
    std::string line;
    bool named = false;
    while (std::getline(lines, line)) {
      named = named || (line.find("cannot run this module") != std::string::npos &&
                        line.find("kernel '" + kernel + "'") != std::string::npos &&
                        line.find(what) != std::string::npos);
    }
    EXPECT_TRUE(named) << log;
  }
  EXPECT_EQ(got["cuModuleLoadData(supported)"], "CUDA_SUCCESS");
  expectDaemonStillServes();
}

TEST_F(ErrorPaths, UnsupportedEntryPointsSaySo) {
  auto got = probe("unsupported");
  EXPECT_EQ(got["cuStreamWaitValue32"], "CUDA_ERROR_NOT_SUPPORTED");
  EXPECT_EQ(got["cuGetProcAddress"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuStreamWaitValue32(proc address)"], "CUDA_ERROR_NOT_SUPPORTED");
}

TEST_F(ErrorPaths, NullPointersAndBadArgumentsAreRejected) {
  auto got = probe("null-pointers");
  EXPECT_EQ(got["cuMemAlloc(null)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuDeviceGetCount(null)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemAlloc(0 bytes)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuDeviceGet(99)"], "CUDA_ERROR_INVALID_DEVICE");
}

TEST_F(ErrorPaths, AnotherClientsMemoryIsUnreachable) {
  auto owner = daemon_.startClient("error_probe", {"alloc-and-hold", "4096"});
  std::string pointer;
  ASSERT_TRUE(eventually([&] {
    auto line = answers(owner->output());
    pointer = line["pointer"];
    return !pointer.empty();
  })) << owner->errors();
  auto got = probe("foreign-pointer", {pointer});
  EXPECT_EQ(got["cuMemcpyDtoH(foreign)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyHtoD(foreign)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemsetD8(foreign)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemFree(foreign)"], "CUDA_ERROR_INVALID_VALUE");
  // A kernel given the pointer stops at it on the sim (on a GPU, one shared context could not
  // stop it: README, "What one shared context isolates"), and the log says whose kernel it was.
  EXPECT_EQ(got["cuLaunchKernel(foreign)"], "CUDA_SUCCESS");
  if (chainedCudaBackend()) {
    // The cuda backend's one context: the kernel reaches the other client's memory unchecked.
    EXPECT_EQ(got["cuCtxSynchronize(after foreign kernel)"], "CUDA_SUCCESS");
    return;
  }
  EXPECT_EQ(got["cuCtxSynchronize(after foreign kernel)"], "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_NE(daemon_.log().find("fill_u32"), std::string::npos) << daemon_.log();
  EXPECT_NE(daemon_.log().find(pointer.substr(2)), std::string::npos) << daemon_.log();
  // The owner's memory is untouched and still accounted to it.
  auto status = daemon_.status();
  EXPECT_EQ(status["devices"][0]["memory_used"], 4096);
}

TEST_F(ErrorPaths, AStickyFaultIsReportedNamesTheClientAndTheGpuRecovers) {
  auto got = probe("trap");
  EXPECT_EQ(got["cuLaunchKernel"], "CUDA_SUCCESS");
  EXPECT_EQ(got["cuCtxSynchronize"], "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(got["cuMemAlloc(after fault)"], "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_NE(daemon_.log().find("poisoned"), std::string::npos) << daemon_.log();
  // Once the faulting client is gone the context is recreated and new clients run.
  EXPECT_TRUE(eventually([&] { return daemon_.status()["devices"][0]["sticky_error"].is_null(); }))
      << daemon_.status().dump(2);
  expectDaemonStillServes();
}

}  // namespace
}  // namespace gpuproxy::testing
