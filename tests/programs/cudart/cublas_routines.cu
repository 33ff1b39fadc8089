// cuBLAS, a closed NVIDIA library with its own kernels (machine code for every GPU, PTX only for
// the newest, which the sim runs), through the stub, each result checked against the host:
// the element-wise level-1 routines (y = a x + y, x = a x) in single and double precision; the
// reductions (dot, nrm2, asum, iamax), which key their state by the context and the stream
// through the driver's private tables, on the default stream and on a stream of the program's
// own; a matrix-vector product (gemv); and a small matrix product (sgemm).
// Ends "cublas_routines: PASSED".
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "checks.cuh"

#define CHECK_BLAS(call) CHECK_STATUS(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)

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

// Values whose products and sums are exact in single precision, so that any order of summation
// gives the host's result.
float exactValue(int i, int period, float offset) {
  return static_cast<float>(i % period) * 0.5f + offset;
}

int reductions(cublasHandle_t handle, cudaStream_t stream, const char* where) {
  CHECK_BLAS(cublasSetStream(handle, stream));
  const int n = 4099;
  std::vector<float> x(n);
  std::vector<float> y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = exactValue(i, 13, -3.0f);
    y[i] = exactValue(i, 7, -1.0f);
  }
  x[2024] = 9.5f;  // the largest magnitude, once
  float* deviceX = nullptr;
  float* deviceY = nullptr;
  CHECK(cudaMalloc(&deviceX, n * sizeof(float)));
  CHECK(cudaMalloc(&deviceY, n * sizeof(float)));
  CHECK(cudaMemcpyAsync(deviceX, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(deviceY, y.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  float dot = 0;
  float norm = 0;
  float absoluteSum = 0;
  int largest = 0;
  CHECK_BLAS(cublasSdot(handle, n, deviceX, 1, deviceY, 1, &dot));
  CHECK_BLAS(cublasSnrm2(handle, n, deviceX, 1, &norm));
  CHECK_BLAS(cublasSasum(handle, n, deviceX, 1, &absoluteSum));
  CHECK_BLAS(cublasIsamax(handle, n, deviceX, 1, &largest));
  double hostDot = 0;
  double hostSquares = 0;
  double hostAbsoluteSum = 0;
  for (int i = 0; i < n; ++i) {
    hostDot += static_cast<double>(x[i]) * y[i];
    hostSquares += static_cast<double>(x[i]) * x[i];
    hostAbsoluteSum += std::fabs(x[i]);
  }
  EXPECT(dot == static_cast<float>(hostDot), "sdot %s: %g, the host %g", where, dot, hostDot);
  EXPECT(absoluteSum == static_cast<float>(hostAbsoluteSum), "sasum %s: %g, the host %g", where,
         absoluteSum, hostAbsoluteSum);
  // nrm2 scales as it goes, so that no square overflows: equal to a few units in the last place.
  const double hostNorm = std::sqrt(hostSquares);
  EXPECT(std::fabs(norm - hostNorm) <= 1e-5 * hostNorm, "snrm2 %s: %g, the host %g", where, norm,
         hostNorm);
  EXPECT(largest == 2024 + 1, "isamax %s: %d, the host %d (1-based)", where, largest, 2024 + 1);
  CHECK(cudaFree(deviceX));
  CHECK(cudaFree(deviceY));
  std::printf("sdot, snrm2, sasum and isamax on %s: as on the host\n", where);
  return 0;
}

// y = A^T x, A column-major. (The plain product's kernels are machine code only: a GPU runs them,
// the sim cannot.)
int matrixVector(cublasHandle_t handle) {
  CHECK_BLAS(cublasSetStream(handle, nullptr));
  const int rows = 1000;
  const int columns = 8;
  std::vector<float> a(rows * columns);
  std::vector<float> x(rows);
  for (int i = 0; i < rows * columns; ++i) a[i] = exactValue(i, 11, -2.0f);
  for (int i = 0; i < rows; ++i) x[i] = exactValue(i, 5, -1.0f);
  float* deviceA = nullptr;
  float* deviceX = nullptr;
  float* deviceY = nullptr;
  CHECK(cudaMalloc(&deviceA, a.size() * sizeof(float)));
  CHECK(cudaMalloc(&deviceX, rows * sizeof(float)));
  CHECK(cudaMalloc(&deviceY, rows * sizeof(float)));
  CHECK(cudaMemcpy(deviceA, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceX, x.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
  const float one = 1;
  const float zero = 0;
  // y (columns) = A^T x (rows)
  CHECK_BLAS(cublasSgemv(handle, CUBLAS_OP_T, rows, columns, &one, deviceA, rows, deviceX, 1, &zero,
                         deviceY, 1));
  std::vector<float> got(columns);
  CHECK(cudaMemcpy(got.data(), deviceY, columns * sizeof(float), cudaMemcpyDeviceToHost));
  for (int j = 0; j < columns; ++j) {
    float expected = 0;
    for (int i = 0; i < rows; ++i) expected += a[j * rows + i] * x[i];
    EXPECT(got[j] == expected, "sgemv (transposed) y[%d] = %g, the host %g", j, got[j], expected);
  }
  CHECK(cudaFree(deviceA));
  CHECK(cudaFree(deviceX));
  CHECK(cudaFree(deviceY));
  std::printf("sgemv (transposed): as on the host\n");
  return 0;
}

// C = A B for 16 x 16 matrices.
int smallMatrixProduct(cublasHandle_t handle) {
  const int n = 16;
  std::vector<float> a(n * n);
  std::vector<float> b(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = exactValue(i, 7, 0.0f);
    b[i] = exactValue(i, 5, -1.0f);
  }
  float* deviceA = nullptr;
  float* deviceB = nullptr;
  float* deviceC = nullptr;
  CHECK(cudaMalloc(&deviceA, n * n * sizeof(float)));
  CHECK(cudaMalloc(&deviceB, n * n * sizeof(float)));
  CHECK(cudaMalloc(&deviceC, n * n * sizeof(float)));
  CHECK(cudaMemcpy(deviceA, a.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceB, b.data(), n * n * sizeof(float), cudaMemcpyHostToDevice));
  const float one = 1;
  const float zero = 0;
  CHECK_BLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, deviceA, n, deviceB, n,
                         &zero, deviceC, n));
  std::vector<float> got(n * n);
  CHECK(cudaMemcpy(got.data(), deviceC, n * n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      float expected = 0;
      for (int k = 0; k < n; ++k) expected += a[k * n + i] * b[j * n + k];
      EXPECT(got[j * n + i] == expected, "sgemm C[%d,%d] = %g, the host %g", i, j, got[j * n + i],
             expected);
    }
  }
  CHECK(cudaFree(deviceA));
  CHECK(cudaFree(deviceB));
  CHECK(cudaFree(deviceC));
  std::printf("sgemm of 16 x 16 matrices: as on the host\n");
  return 0;
}

int main() {
  cublasHandle_t handle;
  CHECK_BLAS(cublasCreate(&handle));
  if (axpyAndScale<float>(handle, "s") != 0) return 1;
  if (axpyAndScale<double>(handle, "d") != 0) return 1;
  if (reductions(handle, nullptr, "the default stream") != 0) return 1;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (reductions(handle, stream, "a stream of its own") != 0) return 1;
  if (matrixVector(handle) != 0) return 1;
  if (smallMatrixProduct(handle) != 0) return 1;
  CHECK_BLAS(cublasDestroy(handle));
  CHECK(cudaStreamDestroy(stream));
  std::printf("cublas_routines: PASSED\n");
  return 0;
}
