// C = A * B with a tiled kernel, a template instantiated for two tile sizes, found by their
// mangled names; sizes not multiples of either tile. Checked against the CPU.
#include "matmul_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

namespace {

bool multiply(const Program& program, const char* kernel, unsigned tile, int m, int n, int k,
              const std::vector<float>& a, const std::vector<float>& b,
              const std::vector<float>& expected) {
  CUdeviceptr deviceA = program.upload(a);
  CUdeviceptr deviceB = program.upload(b);
  CUdeviceptr deviceC = program.allocate<float>(static_cast<std::size_t>(m) * n);
  std::vector<void*> arguments{&deviceA, &deviceB, &deviceC, &m, &n, &k};
  CUDA_PROGRAM_CHECK("matmul", cuLaunchKernel(program.function(kernel), (n + tile - 1) / tile,
                                              (m + tile - 1) / tile, 1, tile, tile, 1, 0, nullptr,
                                              arguments.data(), nullptr));
  CUDA_PROGRAM_CHECK("matmul", cuCtxSynchronize());
  const std::vector<float> c = program.download<float>(deviceC, expected.size());
  program.free(deviceA);
  program.free(deviceB);
  program.free(deviceC);
  int wrong = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] != expected[i] && wrong++ < 5) {
      std::printf("C[%zu] = %g, CPU %g\n", i, c[i], expected[i]);
    }
  }
  std::printf("%dx%d times %dx%d with %ux%u tiles: C[0] = %g, C[last] = %g, %d wrong\n", m, k, k, n,
              tile, tile, c[0], c.back(), wrong);
  return wrong == 0;
}

}  // namespace

int main() {
  Program program("matmul", gpuproxy::testing::kMatmulPtx);
  constexpr int kM = 100;
  constexpr int kN = 75;
  constexpr int kK = 60;
  std::mt19937 random(5);
  std::vector<float> a(kM * kK);
  std::vector<float> b(kK * kN);
  // Small integers: products and sums are exact, so the GPU's result must equal the CPU's.
  for (float& value : a) value = static_cast<float>(static_cast<int>(random() % 9) - 4);
  for (float& value : b) value = static_cast<float>(static_cast<int>(random() % 7) - 3);
  std::vector<float> expected(kM * kN, 0.0f);
  for (int row = 0; row < kM; ++row) {
    for (int column = 0; column < kN; ++column) {
      float sum = 0.0f;
      for (int i = 0; i < kK; ++i) sum += a[row * kK + i] * b[i * kN + column];
      expected[row * kN + column] = sum;
    }
  }
  const bool ok =
      multiply(program, "_Z12matmul_tiledILi16EEvPKfS1_Pfiii", 16, kM, kN, kK, a, b, expected) &&
      multiply(program, "_Z12matmul_tiledILi8EEvPKfS1_Pfiii", 8, kM, kN, kK, a, b, expected);
  std::printf("matmul: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
