// A bitonic sorting network: the host runs log2(n) * (log2(n) + 1) / 2 compare-and-swap passes;
// within a block the passes of small strides run in shared memory without leaving the kernel.

extern "C" __global__ void bitonic_step(int* data, int stride, int size) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned partner = i ^ stride;
  if (partner > i) {
    const bool ascending = (i & size) == 0;
    const int a = data[i];
    const int b = data[partner];
    if ((a > b) == ascending) {
      data[i] = b;
      data[partner] = a;
    }
  }
}

// Every pass with a stride below blockDim.x, for one size, in shared memory.
extern "C" __global__ void bitonic_block(int* data, int size) {
  extern __shared__ int values[];
  const unsigned t = threadIdx.x;
  const unsigned base = blockIdx.x * blockDim.x;
  values[t] = data[base + t];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    const unsigned partner = t ^ stride;
    if (partner > t) {
      const bool ascending = ((base + t) & size) == 0;
      const int a = values[t];
      const int b = values[partner];
      if ((a > b) == ascending) {
        values[t] = b;
        values[partner] = a;
      }
    }
    __syncthreads();
  }
  data[base + t] = values[t];
}
