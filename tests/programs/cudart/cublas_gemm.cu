// cuBLAS's single-precision matrix product, checked against the host: sgemm of square and of
// odd-shaped matrices, and a strided batch of them. cuBLAS ships most GEMM kernels as machine
// code only; the test runs this on a sim device that reports a compute capability for which
// cuBLAS also ships these as PTX (10.0). Ends "cublas_gemm: PASSED".
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "checks.cuh"

#define CHECK_BLAS(call) CHECK_STATUS(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)

namespace {

// C = A B for column-major A (m x k), B (k x n), C (m x n), `batch` times over consecutive
// matrices; checked against the same sums on the host.
int sgemm(cublasHandle_t handle, int m, int n, int k, int batch) {
  const std::size_t sizeA = std::size_t(m) * k;
  const std::size_t sizeB = std::size_t(k) * n;
  const std::size_t sizeC = std::size_t(m) * n;
  std::vector<float> a(sizeA * batch);
  std::vector<float> b(sizeB * batch);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(static_cast<int>(i % 11) - 5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7) * 0.25f;
  float* deviceA = nullptr;
  float* deviceB = nullptr;
  float* deviceC = nullptr;
  CHECK(cudaMalloc(&deviceA, a.size() * sizeof(float)));
  CHECK(cudaMalloc(&deviceB, b.size() * sizeof(float)));
  CHECK(cudaMalloc(&deviceC, sizeC * batch * sizeof(float)));
  CHECK(cudaMemcpy(deviceA, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceB, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(deviceC, 0xff, sizeC * batch * sizeof(float)));  // NaN where nothing is written
  const float one = 1;
  const float zero = 0;
  if (batch == 1) {
    CHECK_BLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, deviceA, m, deviceB, k,
                           &zero, deviceC, m));
  } else {
    CHECK_BLAS(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, deviceA,
                                         m, sizeA, deviceB, k, sizeB, &zero, deviceC, m, sizeC,
                                         batch));
  }
  std::vector<float> c(sizeC * batch);
  CHECK(cudaMemcpy(c.data(), deviceC, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int p = 0; p < batch; ++p) {
    const float* pa = a.data() + p * sizeA;
    const float* pb = b.data() + p * sizeB;
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        double expected = 0;
        for (int l = 0; l < k; ++l) {
          expected += double(pa[l * std::size_t(m) + i]) * double(pb[j * std::size_t(k) + l]);
        }
        const double got = c[p * sizeC + j * std::size_t(m) + i];
        // Every product and partial sum is a multiple of 0.25 well inside float's exact range.
        EXPECT(got == expected, "batch %d: C[%d,%d] = %g, the host %g", p, i, j, got, expected);
      }
    }
  }
  CHECK(cudaFree(deviceA));
  CHECK(cudaFree(deviceB));
  CHECK(cudaFree(deviceC));
  std::printf("sgemm %d x %d x %d, a batch of %d: as on the host\n", m, n, k, batch);
  return 0;
}

}  // namespace

int main() {
  cublasHandle_t handle;
  CHECK_BLAS(cublasCreate(&handle));
  if (sgemm(handle, 128, 128, 128, 1) != 0) return 1;
  if (sgemm(handle, 100, 37, 300, 1) != 0) return 1;
  if (sgemm(handle, 32, 48, 64, 4) != 0) return 1;
  CHECK_BLAS(cublasDestroy(handle));
  std::printf("cublas_gemm: PASSED\n");
  return 0;
}
