// An exclusive prefix sum over many blocks: each block scans its part in shared memory
// (Hillis-Steele, double-buffered), the blocks' totals are scanned the same way, and each block
// adds its offset.

constexpr int kBlock = 256;

__device__ void scanBlock(int* buffer, int value, int* inclusive) {
  int in = 0;
  int out = 1;
  const int t = threadIdx.x;
  buffer[out * kBlock + t] = value;
  __syncthreads();
  for (int offset = 1; offset < kBlock; offset *= 2) {
    in = 1 - in;
    out = 1 - out;
    int sum = buffer[in * kBlock + t];
    if (t >= offset) sum += buffer[in * kBlock + t - offset];
    buffer[out * kBlock + t] = sum;
    __syncthreads();
  }
  *inclusive = buffer[out * kBlock + t];
}

extern "C" __global__ void scan_blocks(const int* in, int* out, int* totals, int n) {
  __shared__ int buffer[2 * kBlock];
  const int i = blockIdx.x * kBlock + threadIdx.x;
  const int value = i < n ? in[i] : 0;
  int inclusive = 0;
  scanBlock(buffer, value, &inclusive);
  if (i < n) out[i] = inclusive - value;
  if (threadIdx.x == kBlock - 1) totals[blockIdx.x] = inclusive;
}

extern "C" __global__ void scan_totals(int* totals, int blocks) {
  __shared__ int buffer[2 * kBlock];
  const int t = threadIdx.x;
  const int value = t < blocks ? totals[t] : 0;
  int inclusive = 0;
  scanBlock(buffer, value, &inclusive);
  if (t < blocks) totals[t] = inclusive - value;
}

extern "C" __global__ void add_offsets(int* out, const int* totals, int n) {
  const int i = blockIdx.x * kBlock + threadIdx.x;
  if (i < n) out[i] += totals[blockIdx.x];
}
