// An out-of-bounds write: a kernel that trusts n more than the allocation behind `data`.

extern "C" __global__ void fill_past_the_end(int* data, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i;
}
