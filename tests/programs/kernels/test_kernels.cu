// Kernels used by the tests, built to PTX (compute_75) at build time: the same PTX runs on a GPU
// and on the sim backend's PTX interpreter.

// c[i] = a[i] + b[i] for every i < n covered by a thread (x dimension only; no grid-stride loop,
// so a launch with too few threads leaves the tail untouched).
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// p[i] = value for every i < n covered by a thread (same coverage rule as vector_add).
extern "C" __global__ void fill_u32(unsigned* p, unsigned value, unsigned long long n) {
  const unsigned long long i =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__device__ __forceinline__ unsigned long long globalTimer() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Occupies the GPU for at least ns nanoseconds of wall-clock time. It sleeps rather than spins
// (__nanosleep sleeps at most about 1 ms), so that on the sim, where the GPU is a CPU, a waiting
// kernel does not burn a core.
extern "C" __global__ void spin(unsigned long long ns) {
  const unsigned long long start = globalTimer();
  for (;;) {
    const unsigned long long elapsed = globalTimer() - start;
    if (elapsed >= ns) break;
    const unsigned long long left = ns - elapsed;
    __nanosleep(left < 1000000ull ? static_cast<unsigned>(left) : 1000000u);
  }
}

// Faults with CUDA_ERROR_ILLEGAL_ADDRESS (a sticky error). A store to an unmapped address rather
// than the `trap` instruction, which a GPU reports as a different error.
extern "C" __global__ void trap() {
  *reinterpret_cast<volatile int*>(8) = 1;
}

// Kernels whose arguments are large structs passed by value: the parameter buffer is 4 KiB plus a
// pointer, or close to CUDA's 32764-byte limit. Thread 0 of block 0 copies every word to `out`,
// so a single byte lost or moved on the way shows up in the output.
struct Words1024 {
  unsigned words[1024];
};
struct Words8000 {
  unsigned words[8000];
};

extern "C" __global__ void copy_words_4k(unsigned* out, Words1024 args) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int i = 0; i < 1024; ++i) out[i] = args.words[i];
  }
}

extern "C" __global__ void copy_words_32k(unsigned* out, Words8000 args) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int i = 0; i < 8000; ++i) out[i] = args.words[i];
  }
}

// Never returns while *flag is 0: a kernel stuck in a loop, for the tests of what happens to a
// GPU's engine when its client dies or the daemon stops meanwhile.
extern "C" __global__ void loop_forever(const volatile int* flag) {
  while (*flag == 0) {
  }
}
