// A convolution whose filter is a __constant__ table, and a lookup through another; checked
// against the CPU.
#include "constant_table_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

int main() {
  Program program("constant_table", gpuproxy::testing::kConstantTablePtx);
  constexpr int kCount = 10000;
  constexpr int kRadius = 4;
  const float filter[2 * kRadius + 1] = {1, 2, 3, 4, 5, 4, 3, 2, 1};
  std::mt19937 random(17);
  std::vector<float> signal(kCount);
  std::vector<int> keys(kCount);
  for (int i = 0; i < kCount; ++i) {
    signal[i] = static_cast<float>(random() % 10);
    keys[i] = static_cast<int>(random());
  }
  CUdeviceptr in = program.upload(signal);
  CUdeviceptr out = program.allocate<float>(kCount);
  CUdeviceptr deviceKeys = program.upload(keys);
  CUdeviceptr looked = program.allocate<int>(kCount);
  int count = kCount;
  program.run(program.function("convolve"), (kCount + 127) / 128, 128, {&in, &out, &count});
  program.run(program.function("lookup"), (kCount + 255) / 256, 256,
              {&deviceKeys, &looked, &count});
  const std::vector<float> convolved = program.download<float>(out, kCount);
  const std::vector<int> squares = program.download<int>(looked, kCount);
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    float sum = 0;
    for (int k = -kRadius; k <= kRadius; ++k) {
      const int j = i + k;
      sum += filter[k + kRadius] * (j >= 0 && j < kCount ? signal[j] : 0.0f);
    }
    if (sum != convolved[i]) ++wrong;
    if (squares[i] != (keys[i] & 15) * (keys[i] & 15)) ++wrong;
  }
  std::printf("convolution of %d samples: out[1] = %g; lookups: %d wrong\n", kCount, convolved[1],
              wrong);
  program.free(in);
  program.free(out);
  program.free(deviceKeys);
  program.free(looked);
  std::printf("constant_table: %s\n", wrong == 0 ? "PASSED" : "FAILED");
  return wrong == 0 ? 0 : 1;
}
