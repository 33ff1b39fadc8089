// cuLaunchKernel's arguments arrive as one pointer per parameter (or one packed buffer in
// `extra`); the stub packs them at the offsets of the kernel's layout. A wrong offset hands the
// kernel garbage; accepting a misuse the driver rejects hides a bug until the app meets a real GPU.

#include "client/stub/launch_params.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using gpuproxy::stub::packKernelParameters;
using gpuproxy::stub::ParameterSlot;

// (const float* a, const float* b, float* c, int n): three pointers and an int, 28 bytes.
const std::vector<ParameterSlot> kVectorAdd = {{0, 8}, {8, 8}, {16, 8}, {24, 4}};
constexpr std::uint32_t kVectorAddBytes = 28;

TEST(LaunchParams, PacksEachParameterAtItsOffset) {
  std::uint64_t a = 0x1000, b = 0x2000, c = 0x3000;
  int n = 42;
  void* params[] = {&a, &b, &c, &n};
  std::vector<std::byte> buffer;
  ASSERT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, params, nullptr, buffer),
            CUDA_SUCCESS);
  ASSERT_EQ(buffer.size(), kVectorAddBytes);
  std::uint64_t pointer;
  std::memcpy(&pointer, buffer.data() + 8, 8);
  EXPECT_EQ(pointer, b);
  int count;
  std::memcpy(&count, buffer.data() + 24, 4);
  EXPECT_EQ(count, 42);
}

TEST(LaunchParams, ExtraBufferOfTheRightSize) {
  std::vector<unsigned char> packed(kVectorAddBytes, 0x5A);
  std::size_t size = packed.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  std::vector<std::byte> buffer;
  ASSERT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, nullptr, extra, buffer),
            CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(buffer.data(), packed.data(), packed.size()), 0);
}

TEST(LaunchParams, ExtraBufferOfAnotherSizeIsInvalid) {
  std::vector<unsigned char> packed(16);
  std::size_t size = packed.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  std::vector<std::byte> buffer;
  EXPECT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, nullptr, extra, buffer),
            CUDA_ERROR_INVALID_VALUE);
}

TEST(LaunchParams, UnknownExtraKeyIsInvalid) {
  void* extra[] = {reinterpret_cast<void*>(0x77), nullptr, CU_LAUNCH_PARAM_END};
  std::vector<std::byte> buffer;
  EXPECT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, nullptr, extra, buffer),
            CUDA_ERROR_INVALID_VALUE);
}

TEST(LaunchParams, BothKernelParamsAndExtraIsInvalid) {
  int n = 0;
  void* params[] = {&n, &n, &n, &n};
  void* extra[] = {CU_LAUNCH_PARAM_END};
  std::vector<std::byte> buffer;
  EXPECT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, params, extra, buffer),
            CUDA_ERROR_INVALID_VALUE);
}

TEST(LaunchParams, MissingArgumentsAreInvalidOnlyWhenTheKernelHasParameters) {
  std::vector<std::byte> buffer;
  EXPECT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, nullptr, nullptr, buffer),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(packKernelParameters({}, 0, nullptr, nullptr, buffer), CUDA_SUCCESS);
  EXPECT_TRUE(buffer.empty());
}

TEST(LaunchParams, NullParameterPointerIsInvalid) {
  std::uint64_t a = 0;
  void* params[] = {&a, nullptr, &a, &a};
  std::vector<std::byte> buffer;
  EXPECT_EQ(packKernelParameters(kVectorAdd, kVectorAddBytes, params, nullptr, buffer),
            CUDA_ERROR_INVALID_VALUE);
}

TEST(LaunchParams, LayoutOutsideItsBufferIsInconsistent) {
  EXPECT_TRUE(gpuproxy::stub::layoutIsConsistent(kVectorAdd, kVectorAddBytes));
  EXPECT_FALSE(gpuproxy::stub::layoutIsConsistent(kVectorAdd, 24));
}

}  // namespace
