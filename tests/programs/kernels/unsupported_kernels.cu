// Kernels the sim's PTX interpreter refuses at load: one class of unsupported PTX per kernel,
// written the way CUDA C++ asks for it. Built once per class (-DUNSUPPORTED_<CLASS>), because a
// module is refused whole at its first unsupported instruction.
#include <cooperative_groups.h>

#if defined(UNSUPPORTED_TEXTURE)
// A fetch from a sparse texture that asks whether its texels are resident (the sim has no sparse
// arrays).
extern "C" __global__ void texture_sample(cudaTextureObject_t texture, float* out) {
  bool resident = false;
  out[threadIdx.x] = tex2D<float>(texture, threadIdx.x + 0.5f, 0.5f, &resident);
  out[threadIdx.x + blockDim.x] = resident ? 1.0f : 0.0f;
}
#elif defined(UNSUPPORTED_SURFACE)
// A surface reduction (sured), which CUDA C++ reaches through inline PTX.
extern "C" __global__ void surface_write(cudaSurfaceObject_t surface) {
  asm volatile("sured.b.add.2d.u32.trap [%0, {%1, %2}], %3;" ::"l"(surface), "r"(threadIdx.x * 4),
               "r"(0), "r"(1u));
}
#elif defined(UNSUPPORTED_TENSOR_CORES)
// mma.sync on 4-bit integers written as inline PTX, as quantised inference kernels do (the sim
// runs mma.sync on 8- and 16-bit inputs, tf32 and f64, and nvcuda::wmma's wmma.*, but no
// sub-byte types).
extern "C" __global__ void tensor_core_tile(const unsigned* a, const unsigned* b, int* c) {
  int d[4] = {0, 0, 0, 0};
  const unsigned* ra = a + threadIdx.x * 2;
  const unsigned* rb = b + threadIdx.x;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(ra[0]), "r"(ra[1]), "r"(rb[0]));
  for (int i = 0; i < 4; ++i) c[threadIdx.x * 4 + i] = d[i];
}
#elif defined(UNSUPPORTED_CLUSTER)
extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_exchange(int* out) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ int value;
  if (threadIdx.x == 0) value = static_cast<int>(blockIdx.x);
  cluster.sync();
  int* other = cluster.map_shared_rank(&value, cluster.block_rank() ^ 1);
  out[blockIdx.x] = *other;
  cluster.sync();
}
#endif
