// cuBLAS's element-wise level-1 routines, a closed NVIDIA library with its own kernels (machine
// code for every GPU, PTX only for the newest, which the sim runs), through the stub: y = a x + y
// and x = a x in single and double precision, each checked element by element against the host.
// Ends "cublas_level1: PASSED".
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "checks.cuh"

#define CHECK_BLAS(call)                                                  \
  do {                                                                    \
    const cublasStatus_t status_ = (call);                                \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                               \
      std::printf("FAILED: %s at line %d returned %s\n", #call, __LINE__, \
                  cublasGetStatusName(status_));                          \
      return 1;                                                           \
    }                                                                     \
  } while (0)

template <typename T>
int axpyAndScale(cublasHandle_t handle, const char* precision) {
  const int n = 100000;
  std::vector<T> x(n);
  std::vector<T> y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<T>(i % 97) * static_cast<T>(0.5);
    y[i] = static_cast<T>(i % 13);
  }
  T* deviceX = nullptr;
  T* deviceY = nullptr;
  CHECK(cudaMalloc(&deviceX, n * sizeof(T)));
  CHECK(cudaMalloc(&deviceY, n * sizeof(T)));
  CHECK(cudaMemcpy(deviceX, x.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceY, y.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  const T alpha = 3;
  const T scale = -2;
  if constexpr (sizeof(T) == 4) {
    CHECK_BLAS(cublasSaxpy(handle, n, &alpha, deviceX, 1, deviceY, 1));
    CHECK_BLAS(cublasSscal(handle, n, &scale, deviceX, 1));
  } else {
    CHECK_BLAS(cublasDaxpy(handle, n, &alpha, deviceX, 1, deviceY, 1));
    CHECK_BLAS(cublasDscal(handle, n, &scale, deviceX, 1));
  }
  std::vector<T> gotX(n);
  std::vector<T> gotY(n);
  CHECK(cudaMemcpy(gotY.data(), deviceY, n * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gotX.data(), deviceX, n * sizeof(T), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(gotY[i] == alpha * x[i] + y[i], "%saxpy y[%d] = %g", precision, i,
           static_cast<double>(gotY[i]));
    EXPECT(gotX[i] == scale * x[i], "%sscal x[%d] = %g", precision, i,
           static_cast<double>(gotX[i]));
  }
  CHECK(cudaFree(deviceX));
  CHECK(cudaFree(deviceY));
  std::printf("%saxpy and %sscal over %d elements: as on the host\n", precision, precision, n);
  return 0;
}

int main() {
  cublasHandle_t handle;
  CHECK_BLAS(cublasCreate(&handle));
  if (axpyAndScale<float>(handle, "s") != 0) return 1;
  if (axpyAndScale<double>(handle, "d") != 0) return 1;
  CHECK_BLAS(cublasDestroy(handle));
  std::printf("cublas_level1: PASSED\n");
  return 0;
}
