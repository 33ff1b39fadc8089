#pragma once
// How the CUDA runtime test programs report: CHECK(call) returns 1 from the calling function,
// after a line naming the call and its error, when a runtime call fails; EXPECT(condition, format,
// ...) the same when a result is not what the program expected. Each program ends with
// "<mode>: PASSED" when nothing failed.

#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(call)                                                            \
  do {                                                                         \
    const cudaError_t status_ = (call);                                        \
    if (status_ != cudaSuccess) {                                              \
      std::printf("FAILED: %s at line %d returned %s (%s)\n", #call, __LINE__, \
                  cudaGetErrorName(status_), cudaGetErrorString(status_));     \
      return 1;                                                                \
    }                                                                          \
  } while (0)

// CHECK_STATUS(call, success, nameOf): the same for a library's own status codes (cuBLAS,
// cuSPARSE), named by the library's nameOf(status).
#define CHECK_STATUS(call, success, nameOf)                                                 \
  do {                                                                                      \
    const auto status_ = (call);                                                            \
    if (status_ != (success)) {                                                             \
      std::printf("FAILED: %s at line %d returned %s\n", #call, __LINE__, nameOf(status_)); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

#define EXPECT(condition, ...)  \
  do {                          \
    if (!(condition)) {         \
      std::printf("FAILED: ");  \
      std::printf(__VA_ARGS__); \
      std::printf("\n");        \
      return 1;                 \
    }                           \
  } while (0)
