// A 256-bin histogram of 4 MiB of bytes, checked against the CPU's.
#include "histogram_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

int main() {
  Program program("histogram", gpuproxy::testing::kHistogramPtx);
  constexpr int kCount = 4 << 20;
  std::mt19937 random(3);
  std::vector<unsigned char> data(kCount);
  // Skewed, so that some bins see many atomic increments at once.
  for (unsigned char& byte : data)
    byte = static_cast<unsigned char>((random() % 256) * (random() % 2));

  CUdeviceptr deviceData = program.upload(data);
  CUdeviceptr bins = program.allocate<unsigned>(256);
  int count = kCount;
  program.run(program.function("histogram"), 64, 256, {&deviceData, &bins, &count});
  const std::vector<unsigned> gpu = program.download<unsigned>(bins, 256);

  std::vector<unsigned> cpu(256, 0);
  for (unsigned char byte : data) ++cpu[byte];
  std::printf("histogram of %d bytes: bin 0 %u (CPU %u), bin 255 %u (CPU %u)\n", kCount, gpu[0],
              cpu[0], gpu[255], cpu[255]);
  program.free(deviceData);
  program.free(bins);
  const bool ok = gpu == cpu;
  std::printf("histogram: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
