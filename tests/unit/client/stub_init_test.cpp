// Before a daemon is involved: what the stub answers before cuInit, and how cuInit fails when
// gpuproxyd cannot be reached. An application must get CUDA's own codes (and the log must say
// which socket to fix), never a hang or a crash.

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

namespace {

using Init = CUresult (*)(unsigned);
using DriverGetVersion = CUresult (*)(int*);
using DeviceGetCount = CUresult (*)(int*);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using MemFree = CUresult (*)(CUdeviceptr);

class StubInitTest : public ::testing::Test {
protected:
  void SetUp() override {
    const char* stub = std::getenv("GPUPROXY_STUB");
    ASSERT_NE(stub, nullptr) << "GPUPROXY_STUB not set";
    handle_ = dlopen(stub, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    init_ = reinterpret_cast<Init>(dlsym(handle_, "cuInit"));
    driverGetVersion_ = reinterpret_cast<DriverGetVersion>(dlsym(handle_, "cuDriverGetVersion"));
    deviceGetCount_ = reinterpret_cast<DeviceGetCount>(dlsym(handle_, "cuDeviceGetCount"));
    ctxGetCurrent_ = reinterpret_cast<CtxGetCurrent>(dlsym(handle_, "cuCtxGetCurrent"));
    memFree_ = reinterpret_cast<MemFree>(dlsym(handle_, "cuMemFree_v2"));
    ASSERT_TRUE(init_ && driverGetVersion_ && deviceGetCount_ && ctxGetCurrent_ && memFree_);
    directory_ = std::filesystem::temp_directory_path() /
                 ("gpuproxy-stub-init-" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override {
    std::filesystem::remove_all(directory_);
    if (handle_ != nullptr) dlclose(handle_);
  }

  void* handle_ = nullptr;
  Init init_ = nullptr;
  DriverGetVersion driverGetVersion_ = nullptr;
  DeviceGetCount deviceGetCount_ = nullptr;
  CtxGetCurrent ctxGetCurrent_ = nullptr;
  MemFree memFree_ = nullptr;
  std::filesystem::path directory_;
};

void expectUninitialised(DeviceGetCount deviceGetCount, CtxGetCurrent ctxGetCurrent,
                         MemFree memFree) {
  int count = -1;
  EXPECT_EQ(deviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  CUcontext context = nullptr;
  EXPECT_EQ(ctxGetCurrent(&context), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(memFree(0), CUDA_ERROR_NOT_INITIALIZED);
}

TEST_F(StubInitTest, UnreachableDaemon) {
  // Before cuInit: the version works, everything else says NOT_INITIALIZED.
  int version = 0;
  EXPECT_EQ(driverGetVersion_(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, CUDA_VERSION);
  EXPECT_EQ(driverGetVersion_(nullptr), CUDA_ERROR_INVALID_VALUE);
  expectUninitialised(deviceGetCount_, ctxGetCurrent_, memFree_);
  EXPECT_EQ(init_(1), CUDA_ERROR_INVALID_VALUE);

  // Nobody listens: NO_DEVICE, and the log names the socket.
  const std::string missing = (directory_ / "missing.sock").string();
  ::setenv("GPUPROXY_SOCKET", missing.c_str(), 1);
  ::setenv("GPUPROXY_LOG_LEVEL", "warn", 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(init_(0), CUDA_ERROR_NO_DEVICE);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("gpuproxy: cannot reach gpuproxyd at " + missing), std::string::npos) << log;
  EXPECT_NE(log.find("GPUPROXY_SOCKET"), std::string::npos) << log;
  expectUninitialised(deviceGetCount_, ctxGetCurrent_, memFree_);

  // Something listens but hangs up without answering attach: still NO_DEVICE, no hang.
  const std::string rude = (directory_ / "rude.sock").string();
  int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, rude.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  std::thread hangUp([listener] {
    int connection = ::accept(listener, nullptr, nullptr);
    if (connection >= 0) ::close(connection);
  });
  ::setenv("GPUPROXY_SOCKET", rude.c_str(), 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(init_(0), CUDA_ERROR_NO_DEVICE);
  const std::string rudeLog = testing::internal::GetCapturedStderr();
  EXPECT_NE(rudeLog.find("gpuproxy: cannot reach gpuproxyd at " + rude), std::string::npos)
      << rudeLog;
  hangUp.join();
  ::close(listener);
  expectUninitialised(deviceGetCount_, ctxGetCurrent_, memFree_);
  ::unsetenv("GPUPROXY_SOCKET");
}

}  // namespace
