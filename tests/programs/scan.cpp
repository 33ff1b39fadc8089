// An exclusive prefix sum of 51,000 ints across 200 blocks, checked against the CPU's.
#include "scan_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>
#include <random>

using gpuproxy::programs::Program;

int main() {
  Program program("scan", gpuproxy::testing::kScanPtx);
  constexpr int kBlock = 256;
  constexpr int kCount = 51000;
  const int blocks = (kCount + kBlock - 1) / kBlock;
  std::mt19937 random(11);
  std::vector<int> values(kCount);
  for (int& value : values) value = static_cast<int>(random() % 100) - 20;

  CUdeviceptr in = program.upload(values);
  CUdeviceptr out = program.allocate<int>(kCount);
  CUdeviceptr totals = program.allocate<int>(blocks);
  int count = kCount;
  int blockCount = blocks;
  program.run(program.function("scan_blocks"), blocks, kBlock, {&in, &out, &totals, &count});
  program.run(program.function("scan_totals"), 1, kBlock, {&totals, &blockCount});
  program.run(program.function("add_offsets"), blocks, kBlock, {&out, &totals, &count});
  const std::vector<int> gpu = program.download<int>(out, kCount);

  int running = 0;
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    if (gpu[i] != running && wrong++ < 5) {
      std::printf("scan[%d] = %d, CPU %d\n", i, gpu[i], running);
    }
    running += values[i];
  }
  std::printf("exclusive scan of %d ints: last %d, total %d\n", kCount, gpu[kCount - 1], running);
  program.free(in);
  program.free(out);
  program.free(totals);
  std::printf("scan: %s\n", wrong == 0 ? "PASSED" : "FAILED");
  return wrong == 0 ? 0 : 1;
}
