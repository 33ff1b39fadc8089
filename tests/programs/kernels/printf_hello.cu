// Device printf: every thread of a small launch prints a line with each kind of conversion.
#include <cstdio>

extern "C" __global__ void hello(int launch) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  printf("launch %d, block %d, thread %d: %s %5.2f %lld %c 0x%x%%\n", launch, blockIdx.x,
         threadIdx.x, t % 2 == 0 ? "even" : "odd", t * 0.25, static_cast<long long>(t) << 33,
         'a' + t % 26, t * 255);
}
