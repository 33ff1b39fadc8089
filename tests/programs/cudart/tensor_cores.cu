// Tensor cores through nvcuda::wmma (built for sm_80), as GEMM tutorials use them. `tensor_cores`
// prints each product it checked and ends with "tensor-cores: PASSED" (exit 0), or a line naming
// the first wrong element (exit 1). Every result is compared with the same product on the host.
//
//   - a tiled f16 GEMM with f32 accumulation, 64 x 48 x 80, one warp per 16 x 16 tile of C
//     looping over K, A row-major and B column-major; then alpha * A.B + beta * C by scaling the
//     fragments element by element, as the CUDA samples do;
//   - f16 accumulation, and the 32 x 8 x 16 and 8 x 32 x 16 shapes, from shared memory;
//   - bf16 and tf32 inputs with f32 accumulation, s8 and u8 inputs with s32 accumulation, f64;
//   - the same through inline PTX, as hand-tuned GEMMs, CUTLASS and Triton write it: mma.sync on
//     fragments laid out as the PTX ISA defines them, A and B staged in shared memory and loaded
//     with ldmatrix (B row-major through ldmatrix.trans), and movmatrix's transpose.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <type_traits>
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

// ---- mma.sync through inline PTX --------------------------------------------------------------
// In a fragment, a lane's quad (lane / 4) picks rows of A and C and columns of B; its place in
// the quad (lane % 4) the other coordinate (PTX ISA, "Matrix Fragments for mma.m16n8k16").

// C (M x N, f32) = A (M x K, row-major) . B (K x N), one warp per 16 x 8 tile of C, 16 of K at a
// time staged in shared memory and loaded with ldmatrix: B stored N x K (column-major) as is, or
// K x N (row-major) through ldmatrix.trans. T is half or __nv_bfloat16.
template <typename T, bool kBColumnMajor>
__global__ void mmaGemm(const T* a, const T* b, float* c, int n, int k) {
  constexpr int kWarps = 4;
  __shared__ __align__(16) T tileA[kWarps][16][16];
  __shared__ __align__(16) T tileB[kWarps][16 * 8];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int tileRow = warp / (n / 8) * 16;
  const int tileColumn = warp % (n / 8) * 8;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int step = 0; step < k; step += 16) {
    for (int e = lane; e < 256; e += 32) {
      tileA[warp][e / 16][e % 16] = a[(tileRow + e / 16) * k + step + e % 16];
    }
    for (int e = lane; e < 128; e += 32) {
      tileB[warp][e] = kBColumnMajor ? b[(tileColumn + e / 16) * k + step + e % 16]  // [n][k]
                                     : b[(step + e / 8) * n + tileColumn + e % 8];   // [k][n]
    }
    __syncwarp();
    // Lanes 8j to 8j + 7 give the rows of matrix j: A's four 8 x 8 quarters, top left first, then
    // bottom left, top right, bottom right; B's two halves along K.
    const int matrix = lane / 8;
    const int row = lane % 8;
    unsigned fa[4];
    unsigned fb[2];
    const auto sharedA = static_cast<unsigned>(
        __cvta_generic_to_shared(&tileA[warp][(matrix & 1) * 8 + row][(matrix >> 1) * 8]));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(fa[0]), "=r"(fa[1]), "=r"(fa[2]), "=r"(fa[3])
                 : "r"(sharedA));
    if (kBColumnMajor) {
      const auto sharedB = static_cast<unsigned>(
          __cvta_generic_to_shared(&tileB[warp][row * 16 + (matrix % 2) * 8]));
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                   : "=r"(fb[0]), "=r"(fb[1])
                   : "r"(sharedB));
    } else {
      const auto sharedB = static_cast<unsigned>(
          __cvta_generic_to_shared(&tileB[warp][((matrix % 2) * 8 + row) * 8]));
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                   : "=r"(fb[0]), "=r"(fb[1])
                   : "r"(sharedB));
    }
    if constexpr (std::is_same_v<T, half>) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
    }
    __syncwarp();
  }
  const int group = lane / 4;
  const int member = lane % 4;
  for (int i = 0; i < 4; ++i) {
    c[(tileRow + group + 8 * (i / 2)) * n + tileColumn + member * 2 + i % 2] = d[i];
  }
}

// One 16 x 8 x 8 tile with f16 accumulation: A (16 x 8, row-major) by ldmatrix.x2, B (8 x 8,
// column-major) by ldmatrix.x1, C and D in two f16x2 registers per lane.
__global__ void mmaHalfAccumulate(const half* a, const half* b, half* cd) {
  __shared__ __align__(16) half tileA[16 * 8];
  __shared__ __align__(16) half tileB[8 * 8];
  const int lane = threadIdx.x;
  for (int e = lane; e < 128; e += 32) tileA[e] = a[e];
  for (int e = lane; e < 64; e += 32) tileB[e] = b[e];
  __syncwarp();
  unsigned fa[2];
  unsigned fb;
  const auto sharedA = static_cast<unsigned>(__cvta_generic_to_shared(&tileA[(lane % 16) * 8]));
  const auto sharedB = static_cast<unsigned>(__cvta_generic_to_shared(&tileB[(lane % 8) * 8]));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(fa[0]), "=r"(fa[1])
               : "r"(sharedA));
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(fb) : "r"(sharedB));
  const int group = lane / 4;
  const int member = lane % 4;
  unsigned c[2];
  for (int i = 0; i < 2; ++i) {
    c[i] = *reinterpret_cast<const unsigned*>(&cd[(group + 8 * i) * 8 + member * 2]);
  }
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %3}, {%4}, {%0, %1};"
      : "+r"(c[0]), "+r"(c[1])
      : "r"(fa[0]), "r"(fa[1]), "r"(fb));
  for (int i = 0; i < 2; ++i) {
    *reinterpret_cast<unsigned*>(&cd[(group + 8 * i) * 8 + member * 2]) = c[i];
  }
}

// One 16 x 8 x 8 tf32 tile, fragments read straight from global memory by the layout: A (16 x 8)
// and B (8 x 8) row-major, D (16 x 8) row-major.
__global__ void mmaTf32(const float* a, const float* b, float* d) {
  const int group = threadIdx.x / 4;
  const int member = threadIdx.x % 4;
  unsigned fa[4];
  unsigned fb[2];
  for (int i = 0; i < 4; ++i) {
    asm("cvt.rna.tf32.f32 %0, %1;"
        : "=r"(fa[i])
        : "f"(a[(group + 8 * (i % 2)) * 8 + member + 4 * (i / 2)]));
  }
  for (int i = 0; i < 2; ++i) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(fb[i]) : "f"(b[(member + 4 * i) * 8 + group]));
  }
  float c[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
  for (int i = 0; i < 4; ++i) d[(group + 8 * (i / 2)) * 8 + member * 2 + i % 2] = c[i];
}

// One 16 x 8 x 32 tile of s8 A (row-major) by u8 B (column-major): four consecutive bytes of a
// row of A, or of a column of B, are one register.
__global__ void mmaInteger(const signed char* a, const unsigned char* b, int* d) {
  const int group = threadIdx.x / 4;
  const int member = threadIdx.x % 4;
  unsigned fa[4];
  unsigned fb[2];
  for (int i = 0; i < 4; ++i) {
    fa[i] = *reinterpret_cast<const unsigned*>(
        &a[(group + 8 * (i % 2)) * 32 + member * 4 + 16 * (i / 2)]);
  }
  for (int i = 0; i < 2; ++i) {
    fb[i] = *reinterpret_cast<const unsigned*>(&b[group * 32 + member * 4 + 16 * i]);
  }
  int c[4] = {-5, 5, 100, -100};
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
  for (int i = 0; i < 4; ++i) d[(group + 8 * (i / 2)) * 8 + member * 2 + i % 2] = c[i];
}

// One 8 x 8 x 4 f64 tile: A (8 x 4) and B (4 x 8) row-major.
__global__ void mmaDouble(const double* a, const double* b, double* d) {
  const int group = threadIdx.x / 4;
  const int member = threadIdx.x % 4;
  double c[2] = {0.25, -0.25};
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(c[0]), "+d"(c[1])
               : "d"(a[group * 4 + member]), "d"(b[member * 8 + group]));
  for (int i = 0; i < 2; ++i) d[group * 8 + member * 2 + i] = c[i];
}

// An 8 x 8 matrix of f16 in fragments, transposed by movmatrix.
__global__ void mmaTranspose(const unsigned short* in, unsigned short* out) {
  const int lane = threadIdx.x;
  const int at = (lane / 4) * 8 + (lane % 4) * 2;
  unsigned value = in[at] | (static_cast<unsigned>(in[at + 1]) << 16);
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %0;" : "+r"(value));
  out[at] = static_cast<unsigned short>(value);
  out[at + 1] = static_cast<unsigned short>(value >> 16);
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

// C = A . B through mmaGemm, against the host's product (exact: small values).
template <typename T, bool kBColumnMajor>
int mmaGemmCheck(const char* what) {
  const int m = 32, n = 16, k = 48;  // four warps of 16 x 8 tiles
  std::vector<float> af(m * k), bf(k * n);
  std::vector<T> a(m * k), b(k * n);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<T>(af[i] = smallValue(i, 4));
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<T>(bf[i] = smallValue(i, 5));
  T* da = toDevice(a);
  T* db = toDevice(b);
  float* dc = toDevice(std::vector<float>(m * n, -1.0f));
  EXPECT(da != nullptr && db != nullptr && dc != nullptr, "copying the matrices in failed");
  mmaGemm<T, kBColumnMajor><<<1, 32 * 4>>>(da, db, dc, n, k);
  CHECK(cudaGetLastError());
  std::vector<float> got(m * n);
  if (fromDevice(got, dc) != 0) return 1;
  for (int row = 0; row < m; ++row) {
    for (int column = 0; column < n; ++column) {
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) {
        sum += af[row * k + i] * (kBColumnMajor ? bf[column * k + i] : bf[i * n + column]);
      }
      EXPECT(got[row * n + column] == sum, "mma.sync %s C[%d][%d] = %f, expected %f", what, row,
             column, got[row * n + column], sum);
    }
  }
  std::printf("mma.sync %s GEMM %dx%dx%d (ldmatrix from shared memory): exact\n", what, m, n, k);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  return 0;
}

// One warp of `kernel` (inputs a and b, an m x n result D, row-major), compared element by element
// with reference(row, column), the host's.
template <typename D, typename A, typename B, typename Reference>
int checkTile(const char* what, void (*kernel)(const A*, const B*, D*), const std::vector<A>& a,
              const std::vector<B>& b, int m, int n, Reference reference) {
  A* da = toDevice(a);
  B* db = toDevice(b);
  D* dd = toDevice(std::vector<D>(m * n));
  EXPECT(da != nullptr && db != nullptr && dd != nullptr, "copying the tiles in failed");
  kernel<<<1, 32>>>(da, db, dd);
  CHECK(cudaGetLastError());
  std::vector<D> got(m * n);
  if (fromDevice(got, dd) != 0) return 1;
  for (int row = 0; row < m; ++row) {
    for (int column = 0; column < n; ++column) {
      const D expected = reference(row, column);
      EXPECT(got[row * n + column] == expected, "mma.sync %s D[%d][%d] = %.17g, expected %.17g",
             what, row, column, static_cast<double>(got[row * n + column]),
             static_cast<double>(expected));
    }
  }
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dd));
  return 0;
}

int mmaSync() {
  if (mmaGemmCheck<half, true>("f16, B column-major") != 0) return 1;
  if (mmaGemmCheck<__nv_bfloat16, false>("bf16, B row-major (ldmatrix.trans)") != 0) return 1;
  {
    std::vector<half> a(16 * 8), b(8 * 8), cd(16 * 8);
    for (int i = 0; i < 16 * 8; ++i) a[i] = __float2half(smallValue(i, 6));
    for (int i = 0; i < 8 * 8; ++i) b[i] = __float2half(smallValue(i, 7));  // column-major
    for (int i = 0; i < 16 * 8; ++i) cd[i] = __float2half(smallValue(i, 8));
    half* da = toDevice(a);
    half* db = toDevice(b);
    half* dcd = toDevice(cd);
    EXPECT(da != nullptr && db != nullptr && dcd != nullptr, "copying the tiles in failed");
    mmaHalfAccumulate<<<1, 32>>>(da, db, dcd);
    CHECK(cudaGetLastError());
    std::vector<half> got(16 * 8);
    if (fromDevice(got, dcd) != 0) return 1;
    for (int row = 0; row < 16; ++row) {
      for (int column = 0; column < 8; ++column) {
        float sum = __half2float(cd[row * 8 + column]);
        for (int i = 0; i < 8; ++i) {
          sum += __half2float(a[row * 8 + i]) * __half2float(b[column * 8 + i]);
        }
        EXPECT(__half2float(got[row * 8 + column]) == sum,
               "mma.sync f16 D[%d][%d] = %f, expected %f", row, column,
               __half2float(got[row * 8 + column]), sum);
      }
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dcd));
  }
  {
    std::vector<float> a(16 * 8), b(8 * 8);
    for (int i = 0; i < 16 * 8; ++i) a[i] = smallValue(i, 9);
    for (int i = 0; i < 8 * 8; ++i) b[i] = smallValue(i, 10);
    auto reference = [&](int row, int column) {
      float sum = 1.0f;
      for (int i = 0; i < 8; ++i) sum += a[row * 8 + i] * b[i * 8 + column];
      return sum;
    };
    if (checkTile<float>("tf32", mmaTf32, a, b, 16, 8, reference) != 0) return 1;
  }
  {
    std::vector<signed char> a(16 * 32);
    std::vector<unsigned char> b(8 * 32);  // column-major
    for (int i = 0; i < 16 * 32; ++i) a[i] = static_cast<signed char>((i * 53) % 256 - 128);
    for (int i = 0; i < 8 * 32; ++i) b[i] = static_cast<unsigned char>((i * 29 + 7) % 256);
    auto reference = [&](int row, int column) {
      const int initial[4] = {-5, 5, 100, -100};
      int sum = initial[(row / 8) * 2 + column % 2];
      for (int i = 0; i < 32; ++i) sum += a[row * 32 + i] * b[column * 32 + i];
      return sum;
    };
    if (checkTile<int>("s8.u8", mmaInteger, a, b, 16, 8, reference) != 0) return 1;
  }
  {
    std::vector<double> a(8 * 4), b(4 * 8);
    for (int i = 0; i < 8 * 4; ++i) a[i] = smallValue(i, 11) / 3.0;
    for (int i = 0; i < 4 * 8; ++i) b[i] = smallValue(i, 12) * 1.5;
    auto reference = [&](int row, int column) {
      double sum = column % 2 == 0 ? 0.25 : -0.25;
      for (int i = 0; i < 4; ++i) sum = std::fma(a[row * 4 + i], b[i * 8 + column], sum);
      return sum;
    };
    if (checkTile<double>("f64", mmaDouble, a, b, 8, 8, reference) != 0) return 1;
  }
  {
    std::vector<unsigned short> in(64);
    for (int i = 0; i < 64; ++i) in[i] = static_cast<unsigned short>(i * 1009 + 3);
    unsigned short* din = toDevice(in);
    unsigned short* dout = toDevice(std::vector<unsigned short>(64));
    EXPECT(din != nullptr && dout != nullptr, "copying the matrix in failed");
    mmaTranspose<<<1, 32>>>(din, dout);
    CHECK(cudaGetLastError());
    std::vector<unsigned short> got(64);
    if (fromDevice(got, dout) != 0) return 1;
    for (int row = 0; row < 8; ++row) {
      for (int column = 0; column < 8; ++column) {
        EXPECT(got[row * 8 + column] == in[column * 8 + row],
               "movmatrix [%d][%d] = %u, expected %u", row, column, got[row * 8 + column],
               in[column * 8 + row]);
      }
    }
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
  }
  std::printf("mma.sync f16 accumulation, tf32, s8.u8 and f64 tiles, movmatrix: as on the host\n");
  return 0;
}

int main() {
  if (gemm() != 0) return 1;
  if (halfAccumulate<16, 16, 16>() != 0) return 1;
  if (halfAccumulate<32, 8, 16>() != 0) return 1;
  if (halfAccumulate<8, 32, 16>() != 0) return 1;
  if (otherTypes() != 0) return 1;
  if (mmaSync() != 0) return 1;
  CHECK(cudaDeviceSynchronize());
  std::printf("tensor-cores: PASSED\n");
  return 0;
}
