// cuGetProcAddress must hand out the exact ABI variant a caller built for a given CUDA version
// expects, without cuInit or a daemon; unsupported calls answer NOT_SUPPORTED; error strings
// match the real driver's.

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GetErrorText = CUresult (*)(CUresult, const char**);
// An entry point nobody has written: its generated definition answers CUDA_ERROR_NOT_SUPPORTED.
using MulticastGranularity = CUresult (*)(size_t*, const CUmulticastObjectProp*,
                                          CUmulticastGranularity_flags);
using MulticastCreate = CUresult (*)(CUmemGenericAllocationHandle*, const CUmulticastObjectProp*);

constexpr cuuint64_t kDefault = CU_GET_PROC_ADDRESS_DEFAULT;
constexpr cuuint64_t kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

// A value no lookup can legitimately return, so a lookup that leaves *pfn alone is caught.
void* const kSentinel = reinterpret_cast<void*>(0x1);

class ProcAddressTest : public ::testing::Test {
protected:
  void SetUp() override {
    const char* stub = std::getenv("GPUPROXY_STUB");
    ASSERT_NE(stub, nullptr) << "GPUPROXY_STUB not set";
    handle_ = dlopen(stub, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    getProcAddress_ = reinterpret_cast<GetProcAddressV2>(symbol("cuGetProcAddress_v2"));
    ASSERT_NE(getProcAddress_, nullptr);
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  void* symbol(const char* name) {
    void* address = dlsym(handle_, name);
    EXPECT_NE(address, nullptr) << name;
    return address;
  }

  struct Lookup {
    CUresult result;
    void* pfn;
    CUdriverProcAddressQueryResult status;
  };

  Lookup lookUp(const char* name, int version, cuuint64_t flags) {
    Lookup out{CUDA_ERROR_UNKNOWN, kSentinel, static_cast<CUdriverProcAddressQueryResult>(-1)};
    out.result = getProcAddress_(name, &out.pfn, version, flags, &out.status);
    return out;
  }

  // Asserts that (name, version, flags) resolves to exactly the exported symbol `expected`.
  void expectResolves(const char* name, int version, cuuint64_t flags, const char* expected) {
    Lookup got = lookUp(name, version, flags);
    EXPECT_EQ(got.result, CUDA_SUCCESS) << name << "@" << version;
    EXPECT_EQ(got.status, CU_GET_PROC_ADDRESS_SUCCESS) << name << "@" << version;
    EXPECT_EQ(got.pfn, symbol(expected))
        << name << "@" << version << " flags " << flags << " should be " << expected << ", got "
        << describe(got.pfn);
  }

  static std::string describe(void* address) {
    Dl_info info{};
    if (address == nullptr || dladdr(address, &info) == 0 || info.dli_sname == nullptr) {
      return "?";
    }
    return info.dli_sname;
  }

  void* handle_ = nullptr;
  GetProcAddressV2 getProcAddress_ = nullptr;
};

TEST_F(ProcAddressTest, PicksTheAbiOfTheRequestedVersion) {
  expectResolves("cuMemAlloc", 13000, kDefault, "cuMemAlloc_v2");
  expectResolves("cuMemAlloc", 3020, kDefault, "cuMemAlloc_v2");
  expectResolves("cuMemAlloc", 3000, kDefault, "cuMemAlloc");
  expectResolves("cuCtxCreate", 2000, kDefault, "cuCtxCreate");
  expectResolves("cuCtxCreate", 3020, kDefault, "cuCtxCreate_v2");
  expectResolves("cuCtxCreate", 11040, kDefault, "cuCtxCreate_v3");
  expectResolves("cuCtxCreate", 12040, kDefault, "cuCtxCreate_v3");
  expectResolves("cuCtxCreate", 12050, kDefault, "cuCtxCreate_v4");
  expectResolves("cuCtxCreate", 13000, kDefault, "cuCtxCreate_v4");
  expectResolves("cuGetProcAddress", 11030, kDefault, "cuGetProcAddress");
  expectResolves("cuGetProcAddress", 12000, kDefault, "cuGetProcAddress_v2");
}

TEST_F(ProcAddressTest, PerThreadFlagPicksThePerThreadTwin) {
  expectResolves("cuLaunchKernel", 13000, kPerThread, "cuLaunchKernel_ptsz");
  expectResolves("cuLaunchKernel", 13000, kDefault, "cuLaunchKernel");
  expectResolves("cuLaunchKernel", 13000, kLegacy, "cuLaunchKernel");
  // The per-thread variants appeared in CUDA 7.0; an older caller gets the legacy one.
  expectResolves("cuLaunchKernel", 6050, kPerThread, "cuLaunchKernel");
  expectResolves("cuMemcpyHtoD", 13000, kPerThread, "cuMemcpyHtoD_v2_ptds");
  expectResolves("cuMemcpyHtoD", 13000, kDefault, "cuMemcpyHtoD_v2");
  expectResolves("cuStreamGetCaptureInfo", 11030, kPerThread, "cuStreamGetCaptureInfo_v2_ptsz");
  // Functions without a per-thread twin still resolve with the flag.
  expectResolves("cuMemAlloc", 13000, kPerThread, "cuMemAlloc_v2");
}

TEST_F(ProcAddressTest, TooOldVersionIsVersionNotSufficient) {
  Lookup got = lookUp("cuCtxCreate", 1000, kDefault);
  EXPECT_EQ(got.result, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(got.pfn, nullptr);
  EXPECT_EQ(got.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

  got = lookUp("cuGetProcAddress", 11020, kDefault);
  EXPECT_EQ(got.result, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(got.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

TEST_F(ProcAddressTest, UnknownSymbolIsSymbolNotFound) {
  for (const char* name : {"cuNoSuchFunction", "", "cuMemAlloc_v2", "cuMemAllocX", "cu"}) {
    Lookup got = lookUp(name, 13000, kDefault);
    EXPECT_EQ(got.result, CUDA_ERROR_NOT_FOUND) << name;
    EXPECT_EQ(got.pfn, nullptr) << name;
    EXPECT_EQ(got.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) << name;
  }
}

TEST_F(ProcAddressTest, NullArgumentsAreInvalidValue) {
  void* pfn = nullptr;
  EXPECT_EQ(getProcAddress_(nullptr, &pfn, 13000, kDefault, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(getProcAddress_("cuInit", nullptr, 13000, kDefault, nullptr), CUDA_ERROR_INVALID_VALUE);
  // The status pointer is optional.
  EXPECT_EQ(getProcAddress_("cuInit", &pfn, 13000, kDefault, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(pfn, symbol("cuInit"));
}

TEST_F(ProcAddressTest, LegacyFourArgumentForm) {
  auto v1 = reinterpret_cast<GetProcAddressV1>(symbol("cuGetProcAddress"));
  ASSERT_NE(v1, nullptr);
  void* pfn = kSentinel;
  EXPECT_EQ(v1("cuCtxCreate", &pfn, 11040, kDefault), CUDA_SUCCESS);
  EXPECT_EQ(pfn, symbol("cuCtxCreate_v3"));
  pfn = kSentinel;
  EXPECT_EQ(v1("cuNoSuchFunction", &pfn, 11040, kDefault), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(pfn, nullptr);
}

// Every base name cudart may ask for resolves, at the newest version, to one of the stub's own
// exported functions.
TEST_F(ProcAddressTest, EveryExportedBaseNameResolvesToAnExport) {
  const char* buildDir = std::getenv("GPUPROXY_BUILD_DIR");
  ASSERT_NE(buildDir, nullptr);
  std::ifstream in(std::filesystem::path(buildDir) / "client/stub/generated/cuda_api_symbols.txt");
  std::set<std::string> exported;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') exported.insert(line);
  }
  ASSERT_GT(exported.size(), 600u);
  int resolved = 0;
  for (const std::string& name : exported) {
    Lookup got = lookUp(name.c_str(), 13000, kDefault);
    if (got.result == CUDA_ERROR_NOT_FOUND) {
      EXPECT_EQ(got.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) << name;
      continue;  // a versioned name such as cuMemAlloc_v2 is not a base name
    }
    ASSERT_EQ(got.result, CUDA_SUCCESS) << name;
    std::string target = describe(got.pfn);
    EXPECT_EQ(exported.count(target), 1u) << name << " -> " << target;
    EXPECT_EQ(got.pfn, symbol(target.c_str())) << name;
    ++resolved;
  }
  EXPECT_GT(resolved, 400);
}

TEST_F(ProcAddressTest, UnsupportedFunctionAnswersNotSupported) {
  // Another function than the logged-once test's, which must be the first call of its own.
  auto create = reinterpret_cast<MulticastCreate>(symbol("cuMulticastCreate"));
  ASSERT_NE(create, nullptr);
  CUmemGenericAllocationHandle handle = 42;
  CUmulticastObjectProp prop = {};
  EXPECT_EQ(create(&handle, &prop), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(handle, 42u);  // left alone
}

// The "not supported" line is written once per function, however often it is called.
TEST_F(ProcAddressTest, UnsupportedFunctionIsLoggedOnce) {
  if (const char* level = std::getenv("GPUPROXY_LOG_LEVEL"); level != nullptr) {
    GTEST_SKIP() << "GPUPROXY_LOG_LEVEL is set";
  }
  auto granularity = reinterpret_cast<MulticastGranularity>(symbol("cuMulticastGetGranularity"));
  ASSERT_NE(granularity, nullptr);
  std::FILE* capture = std::tmpfile();
  ASSERT_NE(capture, nullptr);
  std::fflush(stderr);
  int savedStderr = dup(STDERR_FILENO);
  ASSERT_GE(savedStderr, 0);
  ASSERT_GE(dup2(fileno(capture), STDERR_FILENO), 0);
  CUresult first = granularity(nullptr, nullptr, CU_MULTICAST_GRANULARITY_MINIMUM);
  CUresult second = granularity(nullptr, nullptr, CU_MULTICAST_GRANULARITY_MINIMUM);
  dup2(savedStderr, STDERR_FILENO);
  close(savedStderr);
  EXPECT_EQ(first, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(second, CUDA_ERROR_NOT_SUPPORTED);

  std::rewind(capture);
  std::ostringstream text;
  for (int c = std::fgetc(capture); c != EOF; c = std::fgetc(capture)) text << static_cast<char>(c);
  std::fclose(capture);
  const std::string kLine = "gpuproxy: cuMulticastGetGranularity is not supported\n";
  std::string log = text.str();
  EXPECT_NE(log.find(kLine), std::string::npos) << log;
  EXPECT_EQ(log.find(kLine), log.rfind(kLine)) << "logged more than once:\n" << log;
}

// GPUPROXY_LOG_LEVEL is read once per process, so the silenced case runs in a child: this test
// binary re-executed with the variable set and a filter selecting only the child's half.
TEST_F(ProcAddressTest, LogLevelOffSilencesTheUnsupportedLine) {
  if (std::getenv("GPUPROXY_TEST_LOG_OFF_CHILD") != nullptr) {
    auto granularity = reinterpret_cast<MulticastGranularity>(symbol("cuMulticastGetGranularity"));
    ASSERT_NE(granularity, nullptr);
    EXPECT_EQ(granularity(nullptr, nullptr, CU_MULTICAST_GRANULARITY_MINIMUM),
              CUDA_ERROR_NOT_SUPPORTED);
    return;
  }
  std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::string command =
      "GPUPROXY_LOG_LEVEL=off GPUPROXY_TEST_LOG_OFF_CHILD=1 '" + self +
      "' --gtest_filter=ProcAddressTest.LogLevelOffSilencesTheUnsupportedLine 2>&1 >/dev/null";
  std::FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string log;
  for (int c = std::fgetc(child); c != EOF; c = std::fgetc(child)) log += static_cast<char>(c);
  int status = pclose(child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
  EXPECT_EQ(log.find("is not supported"), std::string::npos) << log;
}

TEST_F(ProcAddressTest, ErrorNamesAndStrings) {
  auto name = reinterpret_cast<GetErrorText>(symbol("cuGetErrorName"));
  auto text = reinterpret_cast<GetErrorText>(symbol("cuGetErrorString"));
  ASSERT_NE(name, nullptr);
  ASSERT_NE(text, nullptr);
  struct Case {
    CUresult code;
    const char* name;
    const char* text;
  };
  for (const Case& c :
       {Case{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
        Case{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
        Case{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
        Case{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
        Case{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"}}) {
    const char* out = nullptr;
    EXPECT_EQ(name(c.code, &out), CUDA_SUCCESS) << c.name;
    ASSERT_NE(out, nullptr);
    EXPECT_STREQ(out, c.name);
    out = nullptr;
    EXPECT_EQ(text(c.code, &out), CUDA_SUCCESS) << c.name;
    ASSERT_NE(out, nullptr);
    EXPECT_STREQ(out, c.text);
  }

  const char* out = "stale";
  EXPECT_EQ(name(static_cast<CUresult>(12345), &out), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(out, nullptr);
  out = "stale";
  EXPECT_EQ(text(static_cast<CUresult>(12345), &out), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(name(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(text(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
