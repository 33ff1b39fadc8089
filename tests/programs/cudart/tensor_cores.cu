// Tensor cores through nvcuda::wmma (built for sm_80), as GEMM tutorials use them. `tensor_cores`
// prints each product it checked and ends with "tensor-cores: PASSED" (exit 0), or a line naming
// the first wrong element (exit 1). Every result is compared with the same product on the host.
//
//   - a tiled f16 GEMM with f32 accumulation, 64 x 48 x 80, one warp per 16 x 16 tile of C
//     looping over K, A row-major and B column-major; then alpha * A.B + beta * C by scaling the
//     fragments element by element, as the CUDA samples do;
//   - f16 accumulation, and the 32 x 8 x 16 and 8 x 32 x 16 shapes, from shared memory;
//   - bf16 and tf32 inputs with f32 accumulation, s8 and u8 inputs with s32 accumulation, f64.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "checks.cuh"

using namespace nvcuda;

// C (M x N, row-major) = alpha * A (M x K, row-major) . B (K x N, column-major) + beta * C.
// Block: one warp per 16 x 16 tile of C.
__global__ void gemmHalf(const half* a, const half* b, float* c, int m, int n, int k, float alpha,
                         float beta) {
  const int tileRow = blockIdx.y * 16;
  const int tileColumn = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 16;
  if (tileRow >= m || tileColumn >= n) return;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> product, existing;
  wmma::fill_fragment(product, 0.0f);
  for (int i = 0; i < k; i += 16) {
    wmma::load_matrix_sync(fa, a + tileRow * k + i, k);
    wmma::load_matrix_sync(fb, b + tileColumn * k + i, k);
    wmma::mma_sync(product, fa, fb, product);
  }
  float* tile = c + tileRow * n + tileColumn;
  wmma::load_matrix_sync(existing, tile, n, wmma::mem_row_major);
  for (int e = 0; e < product.num_elements; ++e) {
    product.x[e] = alpha * product.x[e] + beta * existing.x[e];
  }
  wmma::store_matrix_sync(tile, product, n, wmma::mem_row_major);
}

// One tile of shape M x N x K with f16 accumulation, staged through shared memory: D = A.B + C,
// all row-major, C and D column-major in memory.
template <int M, int N, int K>
__global__ void tileHalfAccumulate(const half* a, const half* b, half* cd) {
  __shared__ half sa[M * K], sb[K * N];
  for (int i = threadIdx.x; i < M * K; i += 32) sa[i] = a[i];
  for (int i = threadIdx.x; i < K * N; i += 32) sb[i] = b[i];
  __syncwarp();
  wmma::fragment<wmma::matrix_a, M, N, K, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, M, N, K, half, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, M, N, K, half> fc;
  wmma::load_matrix_sync(fa, sa, K);
  wmma::load_matrix_sync(fb, sb, N);
  wmma::load_matrix_sync(fc, cd, M, wmma::mem_col_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(cd, fc, M, wmma::mem_col_major);
}

// One 16 x 16 x 16 tile of bf16 with f32 accumulation: D = A.B, A column-major, B row-major.
__global__ void tileBfloat16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fd;
  wmma::fill_fragment(fd, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fd, fa, fb, fd);
  wmma::store_matrix_sync(d, fd, 16, wmma::mem_row_major);
}

// One 16 x 16 x 8 tile of tf32: the inputs rounded with __float_to_tf32, as the API asks.
__global__ void tileTf32(const float* a, const float* b, float* d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> fd;
  wmma::fill_fragment(fd, 1.0f);
  wmma::load_matrix_sync(fa, a, 8);
  wmma::load_matrix_sync(fb, b, 16);
  for (int e = 0; e < fa.num_elements; ++e) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
  for (int e = 0; e < fb.num_elements; ++e) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
  wmma::mma_sync(fd, fa, fb, fd);
  wmma::store_matrix_sync(d, fd, 16, wmma::mem_row_major);
}

// One 16 x 16 x 16 tile of 8-bit integers with s32 accumulation, and saturation.
template <typename T>
__global__ void tileInteger(const T* a, const T* b, int* d, bool saturate) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, int> fd;
  wmma::load_matrix_sync(fd, d, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  if (saturate) {
    wmma::mma_sync(fd, fa, fb, fd, true);
  } else {
    wmma::mma_sync(fd, fa, fb, fd);
  }
  wmma::store_matrix_sync(d, fd, 16, wmma::mem_row_major);
}

// One 8 x 8 x 4 tile of doubles.
__global__ void tileDouble(const double* a, const double* b, double* d) {
  wmma::fragment<wmma::matrix_a, 8, 8, 4, double, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 8, 8, 4, double, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 8, 8, 4, double> fd;
  wmma::fill_fragment(fd, 0.5);
  wmma::load_matrix_sync(fa, a, 4);
  wmma::load_matrix_sync(fb, b, 4);
  wmma::mma_sync(fd, fa, fb, fd);
  wmma::store_matrix_sync(d, fd, 8, wmma::mem_row_major);
}

template <typename T>
T* toDevice(const std::vector<T>& host) {
  T* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  if (cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) !=
      cudaSuccess) {
    return nullptr;
  }
  return device;
}

template <typename T>
int fromDevice(std::vector<T>& host, const T* device) {
  CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return 0;
}

// A small value exactly representable in f16, bf16 and tf32: products and sums of a few of them
// are exact in f32, so the device must match the host to the bit unless rounding is wrong.
float smallValue(int i, int salt) {
  return static_cast<float>(((i * 37 + salt * 11) % 17) - 8) * 0.125f;
}

int gemm() {
  const int m = 64, n = 48, k = 80;
  const float alpha = 2.0f, beta = -0.5f;
  std::vector<float> af(m * k), bf(k * n), c(m * n);
  std::vector<half> a(m * k), b(k * n);
  for (int i = 0; i < m * k; ++i) a[i] = __float2half(af[i] = smallValue(i, 1));
  for (int i = 0; i < k * n; ++i) b[i] = __float2half(bf[i] = smallValue(i, 2));  // column-major
  for (int i = 0; i < m * n; ++i) c[i] = smallValue(i, 3);
  half* da = toDevice(a);
  half* db = toDevice(b);
  float* dc = toDevice(c);
  EXPECT(da != nullptr && db != nullptr && dc != nullptr, "copying the matrices in failed");
  const dim3 block(32 * 3);  // three warps: three tiles of a row of C
  const dim3 grid(n / 16 / 3, m / 16);
  gemmHalf<<<grid, block>>>(da, db, dc, m, n, k, alpha, beta);
  CHECK(cudaGetLastError());
  std::vector<float> got(m * n);
  if (fromDevice(got, dc) != 0) return 1;
  for (int row = 0; row < m; ++row) {
    for (int column = 0; column < n; ++column) {
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += af[row * k + i] * bf[column * k + i];
      const float expected = alpha * sum + beta * c[row * n + column];
      EXPECT(got[row * n + column] == expected, "f16 GEMM C[%d][%d] = %f, expected %f", row, column,
             got[row * n + column], expected);
    }
  }
  std::printf("f16 GEMM %dx%dx%d with f32 accumulation: alpha.A.B + beta.C exact\n", m, n, k);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  return 0;
}

template <int M, int N, int K>
int halfAccumulate() {
  std::vector<half> a(M * K), b(K * N), cd(M * N);
  for (int i = 0; i < M * K; ++i) a[i] = __float2half(smallValue(i, 4));
  for (int i = 0; i < K * N; ++i) b[i] = __float2half(smallValue(i, 5));
  for (int i = 0; i < M * N; ++i) cd[i] = __float2half(smallValue(i, 6));
  half* da = toDevice(a);
  half* db = toDevice(b);
  half* dcd = toDevice(cd);
  EXPECT(da != nullptr && db != nullptr && dcd != nullptr, "copying the tiles in failed");
  tileHalfAccumulate<M, N, K><<<1, 32>>>(da, db, dcd);
  CHECK(cudaGetLastError());
  std::vector<half> got(M * N);
  if (fromDevice(got, dcd) != 0) return 1;
  for (int row = 0; row < M; ++row) {
    for (int column = 0; column < N; ++column) {
      float sum = __half2float(cd[column * M + row]);
      for (int i = 0; i < K; ++i) {
        sum += __half2float(a[row * K + i]) * __half2float(b[i * N + column]);
      }
      const float value = __half2float(got[column * M + row]);
      EXPECT(value == __half2float(__float2half(sum)), "f16 %dx%dx%d D[%d][%d] = %f, expected %f",
             M, N, K, row, column, value, sum);
    }
  }
  std::printf("f16 %dx%dx%d with f16 accumulation from shared memory: exact\n", M, N, K);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dcd));
  return 0;
}

int otherTypes() {
  {  // bf16, A column-major
    std::vector<float> af(256), bf(256);
    std::vector<__nv_bfloat16> a(256), b(256);
    for (int i = 0; i < 256; ++i) a[i] = __float2bfloat16(af[i] = smallValue(i, 7));
    for (int i = 0; i < 256; ++i) b[i] = __float2bfloat16(bf[i] = smallValue(i, 8));
    __nv_bfloat16* da = toDevice(a);
    __nv_bfloat16* db = toDevice(b);
    float* dd = toDevice(std::vector<float>(256));
    EXPECT(da != nullptr && db != nullptr && dd != nullptr, "copying the bf16 tiles in failed");
    tileBfloat16<<<1, 32>>>(da, db, dd);
    CHECK(cudaGetLastError());
    std::vector<float> got(256);
    if (fromDevice(got, dd) != 0) return 1;
    for (int row = 0; row < 16; ++row) {
      for (int column = 0; column < 16; ++column) {
        float sum = 0.0f;
        for (int i = 0; i < 16; ++i) sum += af[i * 16 + row] * bf[i * 16 + column];
        EXPECT(got[row * 16 + column] == sum, "bf16 D[%d][%d] = %f, expected %f", row, column,
               got[row * 16 + column], sum);
      }
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dd));
  }
  {  // tf32: inputs with more precision than tf32 keeps, rounded by the program
    std::vector<float> a(128), b(128);
    for (int i = 0; i < 128; ++i) a[i] = smallValue(i, 9) * (1.0f + 1.0f / 4096);
    for (int i = 0; i < 128; ++i) b[i] = smallValue(i, 10);
    float* da = toDevice(a);
    float* db = toDevice(b);
    float* dd = toDevice(std::vector<float>(256));
    EXPECT(da != nullptr && db != nullptr && dd != nullptr, "copying the tf32 tiles in failed");
    tileTf32<<<1, 32>>>(da, db, dd);
    CHECK(cudaGetLastError());
    std::vector<float> got(256);
    if (fromDevice(got, dd) != 0) return 1;
    for (int row = 0; row < 16; ++row) {
      for (int column = 0; column < 16; ++column) {
        double sum = 1.0;
        for (int i = 0; i < 8; ++i) sum += double(a[row * 8 + i]) * b[i * 16 + column];
        EXPECT(std::fabs(got[row * 16 + column] - sum) <= 1e-3 * (1.0 + std::fabs(sum)),
               "tf32 D[%d][%d] = %f, expected %f", row, column, got[row * 16 + column], sum);
      }
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dd));
  }
  {  // s8 with saturation, u8 without
    std::vector<signed char> a(256), b(256);
    for (int i = 0; i < 256; ++i) a[i] = static_cast<signed char>(i % 2 == 0 ? 127 : -3);
    for (int i = 0; i < 256; ++i) b[i] = static_cast<signed char>(i % 3 == 0 ? 127 : 5);
    std::vector<int> d(256);
    for (int i = 0; i < 256; ++i) d[i] = i == 0 ? 2147483000 : i - 100;
    signed char* da = toDevice(a);
    signed char* db = toDevice(b);
    int* dd = toDevice(d);
    EXPECT(da != nullptr && db != nullptr && dd != nullptr, "copying the s8 tiles in failed");
    tileInteger<signed char><<<1, 32>>>(da, db, dd, true);
    CHECK(cudaGetLastError());
    std::vector<int> got(256);
    if (fromDevice(got, dd) != 0) return 1;
    for (int row = 0; row < 16; ++row) {
      for (int column = 0; column < 16; ++column) {
        long long sum = d[row * 16 + column];
        for (int i = 0; i < 16; ++i) sum += a[row * 16 + i] * b[column * 16 + i];
        const long long expected = sum > 2147483647LL ? 2147483647LL : sum;
        EXPECT(got[row * 16 + column] == expected, "s8 D[%d][%d] = %d, expected %lld", row, column,
               got[row * 16 + column], expected);
      }
    }
    std::vector<unsigned char> ua(256), ub(256);
    for (int i = 0; i < 256; ++i) ua[i] = static_cast<unsigned char>(200 + i % 50);
    for (int i = 0; i < 256; ++i) ub[i] = static_cast<unsigned char>(i % 7);
    unsigned char* dua = toDevice(ua);
    unsigned char* dub = toDevice(ub);
    CHECK(cudaMemset(dd, 0, 256 * sizeof(int)));
    tileInteger<unsigned char><<<1, 32>>>(dua, dub, dd, false);
    CHECK(cudaGetLastError());
    if (fromDevice(got, dd) != 0) return 1;
    for (int row = 0; row < 16; ++row) {
      for (int column = 0; column < 16; ++column) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += ua[row * 16 + i] * ub[column * 16 + i];
        EXPECT(got[row * 16 + column] == sum, "u8 D[%d][%d] = %d, expected %d", row, column,
               got[row * 16 + column], sum);
      }
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dua));
    CHECK(cudaFree(dub));
    CHECK(cudaFree(dd));
  }
  {  // f64
    std::vector<double> a(32), b(32);
    for (int i = 0; i < 32; ++i) a[i] = 1.0 / (i + 1);
    for (int i = 0; i < 32; ++i) b[i] = i * 0.3 - 2.0;
    double* da = toDevice(a);
    double* db = toDevice(b);
    double* dd = toDevice(std::vector<double>(64));
    EXPECT(da != nullptr && db != nullptr && dd != nullptr, "copying the f64 tiles in failed");
    tileDouble<<<1, 32>>>(da, db, dd);
    CHECK(cudaGetLastError());
    std::vector<double> got(64);
    if (fromDevice(got, dd) != 0) return 1;
    for (int row = 0; row < 8; ++row) {
      for (int column = 0; column < 8; ++column) {
        double sum = 0.5;
        for (int i = 0; i < 4; ++i) sum += a[row * 4 + i] * b[column * 4 + i];
        EXPECT(std::fabs(got[row * 8 + column] - sum) <= 1e-12 * (1.0 + std::fabs(sum)),
               "f64 D[%d][%d] = %.17g, expected %.17g", row, column, got[row * 8 + column], sum);
      }
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dd));
  }
  std::printf("bf16, tf32, s8 (saturating), u8 and f64 tiles: as on the host\n");
  return 0;
}

int main() {
  if (gemm() != 0) return 1;
  if (halfAccumulate<16, 16, 16>() != 0) return 1;
  if (halfAccumulate<32, 8, 16>() != 0) return 1;
  if (halfAccumulate<8, 32, 16>() != 0) return 1;
  if (otherTypes() != 0) return 1;
  CHECK(cudaDeviceSynchronize());
  std::printf("tensor-cores: PASSED\n");
  return 0;
}
