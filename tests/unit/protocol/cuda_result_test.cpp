// The CUresult table generated from cuda.h: names for logs, and the short descriptions
// cuGetErrorString hands to applications.

#include "protocol/cuda_result.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>

namespace gpuproxy::protocol {
namespace {

TEST(CudaResultTest, NamesMatchTheEnumerators) {
  EXPECT_EQ(cudaResultName(CUDA_SUCCESS), "CUDA_SUCCESS");
  EXPECT_EQ(cudaResultName(CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(cudaResultName(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(cudaResultName(CUDA_ERROR_ILLEGAL_ADDRESS), "CUDA_ERROR_ILLEGAL_ADDRESS");
  EXPECT_EQ(cudaResultName(CUDA_ERROR_UNKNOWN), "CUDA_ERROR_UNKNOWN");
}

TEST(CudaResultTest, DescriptionsAreTheDriversShortPhrases) {
  EXPECT_EQ(cudaResultDescription(CUDA_SUCCESS), "no error");
  EXPECT_EQ(cudaResultDescription(CUDA_ERROR_INVALID_VALUE), "invalid argument");
  EXPECT_EQ(cudaResultDescription(CUDA_ERROR_OUT_OF_MEMORY), "out of memory");
  EXPECT_EQ(cudaResultDescription(CUDA_ERROR_NO_DEVICE), "no CUDA-capable device is detected");
  EXPECT_EQ(cudaResultDescription(CUDA_ERROR_NOT_SUPPORTED), "operation not supported");
}

TEST(CudaResultTest, UnknownValuesHaveNoEntry) {
  for (int value : {-1, 9, 12345, 1000}) {
    auto result = static_cast<CUresult>(value);
    EXPECT_EQ(cudaResultName(result), std::nullopt) << value;
    EXPECT_EQ(cudaResultDescription(result), std::nullopt) << value;
    EXPECT_EQ(cudaResultNameOr(result, "CUresult(?)"), "CUresult(?)") << value;
  }
  EXPECT_EQ(cudaResultNameOr(CUDA_ERROR_NOT_READY, "x"), "CUDA_ERROR_NOT_READY");
}

// Every code cuda.h defines has a usable entry, including those whose description falls back to
// the doc comment: non-empty, one line, and NUL-terminated so it can be handed out as a C string.
TEST(CudaResultTest, EveryDefinedCodeHasAUsableEntry) {
  int known = 0;
  for (int value = 0; value < 1100; ++value) {
    auto result = static_cast<CUresult>(value);
    auto name = cudaResultName(result);
    auto description = cudaResultDescription(result);
    ASSERT_EQ(name.has_value(), description.has_value()) << value;
    if (!name) continue;
    ++known;
    EXPECT_EQ(name->rfind("CUDA_", 0), 0u) << *name;
    EXPECT_EQ(std::strlen(name->data()), name->size()) << *name;
    ASSERT_FALSE(description->empty()) << *name;
    EXPECT_EQ(std::strlen(description->data()), description->size()) << *name;
    EXPECT_EQ(description->find('\n'), std::string_view::npos) << *name;
    EXPECT_NE(description->back(), '.') << *name << ": " << *description;
    EXPECT_LT(description->size(), 200u) << *name;
  }
  // cuda.h 12/13 defines about 100 codes; a broken parser yields far fewer.
  EXPECT_GT(known, 90);
}

}  // namespace
}  // namespace gpuproxy::protocol
