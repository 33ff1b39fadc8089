// Matrix multiply, tiled through shared memory, the tile size a template parameter (the host
// finds the instantiation by its mangled name, as a driver-API program using templates must).
// C[M x N] = A[M x K] * B[K x N], row-major; sizes need not be multiples of the tile.

template <int Tile>
__global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float tileA[Tile][Tile];
  __shared__ float tileB[Tile][Tile];
  const int row = blockIdx.y * Tile + threadIdx.y;
  const int column = blockIdx.x * Tile + threadIdx.x;
  float sum = 0.0f;
  for (int base = 0; base < k; base += Tile) {
    tileA[threadIdx.y][threadIdx.x] =
        row < m && base + threadIdx.x < k ? a[row * k + base + threadIdx.x] : 0.0f;
    tileB[threadIdx.y][threadIdx.x] =
        column < n && base + threadIdx.y < k ? b[(base + threadIdx.y) * n + column] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Tile; ++i) sum += tileA[threadIdx.y][i] * tileB[i][threadIdx.x];
    __syncthreads();
  }
  if (row < m && column < n) c[row * n + column] = sum;
}

template __global__ void matmul_tiled<16>(const float*, const float*, float*, int, int, int);
template __global__ void matmul_tiled<8>(const float*, const float*, float*, int, int, int);
