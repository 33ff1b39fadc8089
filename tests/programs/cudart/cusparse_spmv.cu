// cuSPARSE, a closed NVIDIA library that ships its kernels as machine code for each GPU and as
// PTX only for the newest: y = A x for a sparse matrix in CSR form (cusparseSpMV), then a few
// steps of the conjugate-gradient method with cuBLAS (dot, axpy, scal, copy) on the same
// matrix, as NVIDIA's conjugateGradient sample does, each result checked against the host.
// Ends "cusparse_spmv: PASSED".
//
// On the sim this needs a device that reports the compute capability those kernels' PTX was built
// for (gpuproxyd --sim-compute-capability 12.0): standing in for an H100's machine code, the PTX
// is another build of the kernel, which cuSPARSE launches with block sizes it was not built for.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "checks.cuh"

#define CHECK_SPARSE(call) CHECK_STATUS(call, CUSPARSE_STATUS_SUCCESS, cusparseGetErrorName)
#define CHECK_BLAS(call) CHECK_STATUS(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)

int main() {
  // The 1D Laplacian with 4 on the diagonal: symmetric positive definite, exact in floats.
  const int n = 1000;
  std::vector<int> rows(n + 1);
  std::vector<int> columns;
  std::vector<float> values;
  for (int i = 0; i < n; ++i) {
    rows[i] = static_cast<int>(columns.size());
    for (int j = i - 1; j <= i + 1; ++j) {
      if (j < 0 || j >= n) continue;
      columns.push_back(j);
      values.push_back(i == j ? 4.0f : -1.0f);
    }
  }
  rows[n] = static_cast<int>(columns.size());
  const int nonzeros = rows[n];
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;

  int* deviceRows = nullptr;
  int* deviceColumns = nullptr;
  float* deviceValues = nullptr;
  float* deviceX = nullptr;
  float* deviceY = nullptr;
  CHECK(cudaMalloc(&deviceRows, (n + 1) * sizeof(int)));
  CHECK(cudaMalloc(&deviceColumns, nonzeros * sizeof(int)));
  CHECK(cudaMalloc(&deviceValues, nonzeros * sizeof(float)));
  CHECK(cudaMalloc(&deviceX, n * sizeof(float)));
  CHECK(cudaMalloc(&deviceY, n * sizeof(float)));
  CHECK(cudaMemcpy(deviceRows, rows.data(), (n + 1) * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceColumns, columns.data(), nonzeros * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceValues, values.data(), nonzeros * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(deviceX, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(deviceY, 0xff, n * sizeof(float)));  // NaNs: every element must be written

  cusparseHandle_t sparse;
  CHECK_SPARSE(cusparseCreate(&sparse));
  cusparseSpMatDescr_t matrix;
  CHECK_SPARSE(cusparseCreateCsr(&matrix, n, n, nonzeros, deviceRows, deviceColumns, deviceValues,
                                 CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO,
                                 CUDA_R_32F));
  cusparseDnVecDescr_t vectorX;
  cusparseDnVecDescr_t vectorY;
  CHECK_SPARSE(cusparseCreateDnVec(&vectorX, n, deviceX, CUDA_R_32F));
  CHECK_SPARSE(cusparseCreateDnVec(&vectorY, n, deviceY, CUDA_R_32F));
  const float one = 1.0f;
  const float zero = 0.0f;
  size_t bufferBytes = 0;
  CHECK_SPARSE(cusparseSpMV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matrix,
                                       vectorX, &zero, vectorY, CUDA_R_32F,
                                       CUSPARSE_SPMV_ALG_DEFAULT, &bufferBytes));
  void* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, bufferBytes + 1));
  CHECK_SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matrix, vectorX, &zero,
                            vectorY, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, buffer));
  std::vector<float> y(n);
  CHECK(cudaMemcpy(y.data(), deviceY, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    float expected = 0.0f;
    for (int k = rows[i]; k < rows[i + 1]; ++k) expected += values[k] * x[columns[k]];
    EXPECT(y[i] == expected, "SpMV y[%d] = %g, the host %g", i, y[i], expected);
  }
  std::printf("SpMV of a %d x %d CSR matrix with %d non-zeros: as on the host\n", n, n, nonzeros);

  // Conjugate gradient for A x = b, b = A x (so the answer is x), from 0, ten steps.
  cublasHandle_t blas;
  CHECK_BLAS(cublasCreate(&blas));
  float* r = deviceY;  // r = b - A 0 = b
  float* p = nullptr;
  float* ap = nullptr;
  float* solution = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(float)));
  CHECK(cudaMalloc(&ap, n * sizeof(float)));
  CHECK(cudaMalloc(&solution, n * sizeof(float)));
  CHECK(cudaMemset(solution, 0, n * sizeof(float)));
  CHECK_BLAS(cublasScopy(blas, n, r, 1, p, 1));
  cusparseDnVecDescr_t vectorP;
  cusparseDnVecDescr_t vectorAp;
  CHECK_SPARSE(cusparseCreateDnVec(&vectorP, n, p, CUDA_R_32F));
  CHECK_SPARSE(cusparseCreateDnVec(&vectorAp, n, ap, CUDA_R_32F));
  float rr = 0.0f;
  CHECK_BLAS(cublasSdot(blas, n, r, 1, r, 1, &rr));
  const float initial = std::sqrt(rr);
  for (int step = 0; step < 10; ++step) {
    CHECK_SPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matrix, vectorP,
                              &zero, vectorAp, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, buffer));
    float pAp = 0.0f;
    CHECK_BLAS(cublasSdot(blas, n, p, 1, ap, 1, &pAp));
    const float alpha = rr / pAp;
    const float minusAlpha = -alpha;
    CHECK_BLAS(cublasSaxpy(blas, n, &alpha, p, 1, solution, 1));
    CHECK_BLAS(cublasSaxpy(blas, n, &minusAlpha, ap, 1, r, 1));
    float next = 0.0f;
    CHECK_BLAS(cublasSdot(blas, n, r, 1, r, 1, &next));
    const float beta = next / rr;
    rr = next;
    CHECK_BLAS(cublasSscal(blas, n, &beta, p, 1));
    CHECK_BLAS(cublasSaxpy(blas, n, &one, r, 1, p, 1));
  }
  std::vector<float> got(n);
  CHECK(cudaMemcpy(got.data(), solution, n * sizeof(float), cudaMemcpyDeviceToHost));
  float worst = 0.0f;
  for (int i = 0; i < n; ++i) worst = std::fmax(worst, std::fabs(got[i] - x[i]));
  const float residual = std::sqrt(rr);
  std::printf("conjugate gradient: residual %.3g after 10 steps (from %.3g), largest error %.3g\n",
              residual, initial, worst);
  // A strictly diagonally dominant system: CG converges fast; NaN fails both tests.
  EXPECT(residual < 1e-3f * initial, "the residual did not shrink: %g from %g", residual, initial);
  EXPECT(worst < 1e-3f, "the solution is off by %g", worst);

  CHECK_SPARSE(cusparseDestroyDnVec(vectorX));
  CHECK_SPARSE(cusparseDestroyDnVec(vectorY));
  CHECK_SPARSE(cusparseDestroyDnVec(vectorP));
  CHECK_SPARSE(cusparseDestroyDnVec(vectorAp));
  CHECK_SPARSE(cusparseDestroySpMat(matrix));
  CHECK_SPARSE(cusparseDestroy(sparse));
  CHECK_BLAS(cublasDestroy(blas));
  std::printf("cusparse_spmv: PASSED\n");
  return 0;
}
