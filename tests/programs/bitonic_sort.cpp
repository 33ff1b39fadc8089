// Sorts 65,536 ints with a bitonic sorting network, and checks the result is the CPU's sort.
#include "bitonic_sort_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

int main() {
  Program program("bitonic_sort", gpuproxy::testing::kBitonicSortPtx);
  constexpr int kCount = 1 << 16;
  constexpr int kBlock = 512;
  std::mt19937 random(13);
  std::vector<int> values(kCount);
  for (int& value : values) value = static_cast<int>(random() % 100000) - 50000;

  CUdeviceptr data = program.upload(values);
  CUfunction step = program.function("bitonic_step");
  CUfunction block = program.function("bitonic_block");
  for (int size = 2; size <= kCount; size *= 2) {
    int stride = size / 2;
    for (; stride >= kBlock; stride /= 2) {
      program.run(step, kCount / kBlock, kBlock, {&data, &stride, &size});
    }
    // The passes with strides below the block size, in shared memory.
    program.run(block, kCount / kBlock, kBlock, {&data, &size}, kBlock * sizeof(int));
  }
  const std::vector<int> gpu = program.download<int>(data, kCount);
  std::sort(values.begin(), values.end());
  program.free(data);
  std::printf("sorted %d ints: first %d, median %d, last %d\n", kCount, gpu.front(),
              gpu[kCount / 2], gpu.back());
  const bool ok = gpu == values;
  std::printf("bitonic_sort: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
