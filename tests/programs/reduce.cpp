// Sums a million floats and finds the maximum of a million ints on the GPU, and checks both
// against the CPU. An ordinary driver-API program (see cuda_program.hpp).
#include "reduce_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

int main() {
  Program program("reduce", gpuproxy::testing::kReducePtx);
  constexpr int kCount = 1 << 20;
  std::mt19937 random(7);
  std::vector<float> values(kCount);
  std::vector<int> integers(kCount);
  for (int i = 0; i < kCount; ++i) {
    // Small integers: every partial sum is exact in a float, so any order of addition agrees.
    values[i] = static_cast<float>(random() % 4);
    integers[i] = static_cast<int>(random() % 2000000) - 1000000;
  }
  integers[kCount / 3] = 1999999;

  CUdeviceptr deviceValues = program.upload(values);
  CUdeviceptr sum = program.allocate<float>(1);
  int count = kCount;
  program.run(program.function("reduce_sum"), 120, 256, {&deviceValues, &sum, &count});
  const float gpuSum = program.download<float>(sum, 1)[0];

  CUdeviceptr deviceIntegers = program.upload(integers);
  CUdeviceptr maximum = program.upload(std::vector<int>{-2147483647 - 1});
  program.run(program.function("reduce_max"), (kCount + 511) / 512, 512,
              {&deviceIntegers, &maximum, &count}, 512 * sizeof(int));
  const int gpuMax = program.download<int>(maximum, 1)[0];

  double cpuSum = 0;
  for (float value : values) cpuSum += value;
  const int cpuMax = *std::max_element(integers.begin(), integers.end());
  std::printf("sum of %d floats: %.1f (CPU %.1f)\n", kCount, gpuSum, cpuSum);
  std::printf("maximum of %d ints: %d (CPU %d)\n", kCount, gpuMax, cpuMax);
  program.free(deviceValues);
  program.free(sum);
  program.free(deviceIntegers);
  program.free(maximum);
  const bool ok = gpuSum == cpuSum && gpuMax == cpuMax;
  std::printf("reduce: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
