// The stub keeps what the daemon reported about failed asynchronous commands until the call at
// which CUDA would report it: a stream's error at a synchronisation of that stream (not of
// another), the context's earliest error at a context-wide one, a kernel fault at every later
// call until the context is reset.

#include "client/stub/async_errors.hpp"

#include <gtest/gtest.h>

namespace {

using gpuproxy::protocol::ring::AsyncError;
using gpuproxy::stub::AsyncErrors;

constexpr std::uint64_t kContext = 0x10;
constexpr std::uint64_t kOtherContext = 0x20;
constexpr std::uint64_t kStreamA = 0xa0;
constexpr std::uint64_t kStreamB = 0xb0;

AsyncError failure(std::uint64_t sequence, std::uint64_t stream, CUresult result,
                   std::uint64_t context = kContext) {
  return AsyncError{sequence, context, stream, result, 0};
}

TEST(AsyncErrors, AStreamsErrorIsReportedOnceBySynchronisingThatStream) {
  AsyncErrors errors;
  errors.record(failure(5, kStreamA, CUDA_ERROR_INVALID_VALUE));
  EXPECT_EQ(errors.takeForStream(kContext, kStreamB), CUDA_SUCCESS);
  EXPECT_EQ(errors.takeForStream(kOtherContext, kStreamA), CUDA_SUCCESS);
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_SUCCESS);
  EXPECT_EQ(errors.takeForContext(kContext), CUDA_SUCCESS);
}

TEST(AsyncErrors, AStreamReportsItsFirstFailureNotTheLaterOnes) {
  AsyncErrors errors;
  errors.record(failure(5, kStreamA, CUDA_ERROR_INVALID_VALUE));
  errors.record(failure(6, kStreamA, CUDA_ERROR_INVALID_HANDLE));
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_SUCCESS);
}

TEST(AsyncErrors, AContextWideSynchronisationReportsTheEarliestAndClearsAll) {
  AsyncErrors errors;
  errors.record(failure(9, kStreamB, CUDA_ERROR_INVALID_HANDLE));
  errors.record(failure(7, kStreamA, CUDA_ERROR_INVALID_VALUE));
  errors.record(failure(8, kStreamA, CUDA_ERROR_OUT_OF_MEMORY, kOtherContext));
  EXPECT_EQ(errors.takeForContext(kContext), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(errors.takeForStream(kContext, kStreamB), CUDA_SUCCESS);
  EXPECT_EQ(errors.takeForContext(kContext), CUDA_SUCCESS);
  // Another context's error is its own.
  EXPECT_EQ(errors.takeForContext(kOtherContext), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST(AsyncErrors, TheLegacyNullStreamSynchronisesWithTheWholeContext) {
  AsyncErrors errors;
  errors.record(failure(3, kStreamA, CUDA_ERROR_INVALID_VALUE));
  EXPECT_EQ(errors.takeForStream(kContext, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_SUCCESS);
}

TEST(AsyncErrors, AKernelFaultIsReportedByEveryCallUntilTheContextIsForgotten) {
  AsyncErrors errors;
  EXPECT_FALSE(errors.anySticky());
  errors.record(failure(4, kStreamA, CUDA_ERROR_INVALID_VALUE));
  errors.record(failure(5, kStreamA, CUDA_ERROR_ILLEGAL_ADDRESS));
  errors.record(failure(6, kStreamB, CUDA_ERROR_LAUNCH_FAILED));
  EXPECT_TRUE(errors.anySticky());
  for (int call = 0; call < 3; ++call) {
    EXPECT_EQ(errors.sticky(kContext), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(errors.takeForStream(kContext, kStreamB), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(errors.takeForContext(kContext), CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  EXPECT_EQ(errors.sticky(kOtherContext), CUDA_SUCCESS);
  errors.forget(kContext);
  EXPECT_FALSE(errors.anySticky());
  EXPECT_EQ(errors.sticky(kContext), CUDA_SUCCESS);
  EXPECT_EQ(errors.takeForContext(kContext), CUDA_SUCCESS);
}

TEST(AsyncErrors, SuccessIsNotAnError) {
  AsyncErrors errors;
  errors.record(failure(1, kStreamA, CUDA_SUCCESS));
  EXPECT_EQ(errors.takeForStream(kContext, kStreamA), CUDA_SUCCESS);
  EXPECT_FALSE(errors.anySticky());
}

}  // namespace
