// cuGetExportTable, as the CUDA runtime calls it before and after cuInit: the tables it asks for
// by UUID, each with its size header where the runtime reads one; slots nobody understands answer
// CUDA_ERROR_NOT_SUPPORTED instead of jumping through null; unknown tables are refused.

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

using GetExportTable = CUresult (*)(const void**, const CUuuid*);

CUuuid uuid(std::initializer_list<unsigned> bytes) {
  CUuuid id{};
  int i = 0;
  for (unsigned byte : bytes) id.bytes[i++] = static_cast<char>(byte);
  return id;
}

const CUuuid kCudartInterface = uuid({0x6B, 0xD5, 0xFB, 0x6C, 0x5B, 0xF4, 0xE7, 0x4A, 0x89, 0x87,
                                      0xD9, 0x39, 0x12, 0xFD, 0x9D, 0xF9});
const CUuuid kContextLocalStorage = uuid({0xC6, 0x93, 0x33, 0x6E, 0x11, 0x21, 0xDF, 0x11, 0xA8,
                                          0xC3, 0x68, 0xF3, 0x55, 0xD8, 0x95, 0x93});
const CUuuid kIntegrityCheck = uuid({0xD4, 0x08, 0x20, 0x55, 0xBD, 0xE6, 0x70, 0x4B, 0x8D, 0x34,
                                     0xBA, 0x12, 0x3C, 0x66, 0xE1, 0xF2});
const CUuuid kToolsTls = uuid({0x42, 0xD8, 0x5A, 0x81, 0x23, 0xF6, 0xCB, 0x47, 0x82, 0x98, 0xF6,
                               0xE7, 0x8A, 0x3A, 0xEC, 0xDC});
const CUuuid kContextInternals = uuid({0x21, 0x31, 0x8C, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8C, 0xA6,
                                       0x41, 0xFF, 0x73, 0x24, 0xC8, 0xF2});
const CUuuid kDeviceExtendedRuntime = uuid({0xB1, 0x05, 0x41, 0xE1, 0xF7, 0xC7, 0xC7, 0x4A, 0x9F,
                                            0x64, 0xF2, 0x23, 0xBE, 0x99, 0xF1, 0xE2});

class PrivateTablesTest : public ::testing::Test {
protected:
  void SetUp() override {
    const char* stub = std::getenv("GPUPROXY_STUB");
    ASSERT_NE(stub, nullptr) << "GPUPROXY_STUB not set";
    handle_ = dlopen(stub, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    getExportTable_ = reinterpret_cast<GetExportTable>(dlsym(handle_, "cuGetExportTable"));
    ASSERT_NE(getExportTable_, nullptr);
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  const void* const* table(const CUuuid& id) {
    const void* found = nullptr;
    EXPECT_EQ(getExportTable_(&found, &id), CUDA_SUCCESS);
    return static_cast<const void* const*>(found);
  }

  void* handle_ = nullptr;
  GetExportTable getExportTable_ = nullptr;
};

TEST_F(PrivateTablesTest, KnownTablesAnswerBeforeCuInitWithTheirSizes) {
  const void* const* cudart = table(kCudartInterface);
  ASSERT_NE(cudart, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cudart[0]), 13 * sizeof(void*));
  const void* const* integrity = table(kIntegrityCheck);
  ASSERT_NE(integrity, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(integrity[0]), 3 * sizeof(void*));
  // The context-local storage table has no size header: its slot 0 is a function.
  const void* const* storage = table(kContextLocalStorage);
  ASSERT_NE(storage, nullptr);
  EXPECT_GT(reinterpret_cast<std::uintptr_t>(storage[0]), 4096u);
  // The same table every time: the runtime compares addresses.
  EXPECT_EQ(table(kCudartInterface), cudart);
}

TEST_F(PrivateTablesTest, AnUnderstoodSlotWorksAndAnUnknownOneRefusesRatherThanCrashes) {
  const void* const* integrity = table(kIntegrityCheck);
  ASSERT_NE(integrity, nullptr);
  using Check = CUresult (*)(unsigned, std::uint64_t, std::uint64_t*);
  std::uint64_t answer[2] = {};
  EXPECT_EQ(reinterpret_cast<Check>(const_cast<void*>(integrity[1]))(13002, 1, answer),
            CUDA_SUCCESS);
  EXPECT_TRUE(answer[0] != 0 || answer[1] != 0);

  const void* const* extended = table(kDeviceExtendedRuntime);
  ASSERT_NE(extended, nullptr);
  using Unknown = CUresult (*)();
  EXPECT_EQ(reinterpret_cast<Unknown>(const_cast<void*>(extended[3]))(), CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(PrivateTablesTest, UnknownTablesAndBadArgumentsAreRefused) {
  const void* found = reinterpret_cast<const void*>(1);
  const CUuuid unknown = uuid({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  EXPECT_EQ(getExportTable_(&found, &unknown), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(found, nullptr);
  EXPECT_EQ(getExportTable_(nullptr, &kCudartInterface), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(getExportTable_(&found, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(PrivateTablesTest, ContextStorageNeedsAContext) {
  const void* const* storage = table(kContextLocalStorage);
  ASSERT_NE(storage, nullptr);
  using Get = CUresult (*)(void**, CUcontext, void*);
  void* value = nullptr;
  int key = 0;
  // No cuInit, so no current context: as the driver answers for a missing context.
  EXPECT_EQ(reinterpret_cast<Get>(const_cast<void*>(storage[2]))(&value, nullptr, &key),
            CUDA_ERROR_INVALID_CONTEXT);
}

// What cuBLAS keys its per-context and per-stream state by. With a context, the integration test
// (cublas_routines) shows them at work; here, what they answer without one.
TEST_F(PrivateTablesTest, ContextAndStreamIdentitiesNeedAContextAndSomewhereToWrite) {
  const void* const* tls = table(kToolsTls);
  ASSERT_NE(tls, nullptr);
  using CurrentContext = CUresult (*)(CUcontext*);
  auto current = reinterpret_cast<CurrentContext>(const_cast<void*>(tls[2]));
  CUcontext context = reinterpret_cast<CUcontext>(1);
  EXPECT_EQ(current(&context), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(context, nullptr);
  EXPECT_EQ(current(nullptr), CUDA_ERROR_INVALID_VALUE);

  const void* const* internals = table(kContextInternals);
  ASSERT_NE(internals, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(internals[0]), 93 * sizeof(void*));
  using ContextId = CUresult (*)(CUcontext, unsigned long long*);
  unsigned long long id = 0;
  EXPECT_NE(reinterpret_cast<ContextId>(const_cast<void*>(internals[4]))(nullptr, &id),
            CUDA_SUCCESS);
  using StreamBehind = CUresult (*)(CUcontext, CUstream, CUstream*, int);
  EXPECT_EQ(reinterpret_cast<StreamBehind>(const_cast<void*>(internals[51]))(nullptr, nullptr,
                                                                             nullptr, 0),
            CUDA_ERROR_INVALID_VALUE);
  using StreamIdentity = CUresult (*)(CUcontext, CUstream, unsigned long long*);
  EXPECT_EQ(
      reinterpret_cast<StreamIdentity>(const_cast<void*>(internals[39]))(nullptr, nullptr, &id),
      CUDA_ERROR_INVALID_VALUE);
  // A slot nobody understands refuses.
  using Unknown = CUresult (*)();
  EXPECT_EQ(reinterpret_cast<Unknown>(const_cast<void*>(internals[10]))(),
            CUDA_ERROR_NOT_SUPPORTED);
}

}  // namespace
