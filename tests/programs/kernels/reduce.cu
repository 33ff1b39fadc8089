// Reductions as CUDA programs write them: a grid-stride loop, warp shuffles, shared memory for the
// warps' partial results, one atomic per block.

__device__ __forceinline__ float warpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

extern "C" __global__ void reduce_sum(const float* in, float* out, int n) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  float sum = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    sum += in[i];
  }
  sum = warpSum(sum);
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
    sum = warpSum(sum);
    if (lane == 0) atomicAdd(out, sum);
  }
}

// The classic shared-memory tree, for the maximum.
extern "C" __global__ void reduce_max(const int* in, int* out, int n) {
  extern __shared__ int values[];
  const unsigned t = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  values[t] = i < n ? in[i] : -2147483647 - 1;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) values[t] = max(values[t], values[t + stride]);
    __syncthreads();
  }
  if (t == 0) atomicMax(out, values[0]);
}
