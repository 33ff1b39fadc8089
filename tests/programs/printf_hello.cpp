// Kernels that print: two launches of 2 blocks of 3 threads. Their lines appear on stdout by the
// time cuCtxSynchronize returns, as on a GPU (in no particular order across threads).
#include "printf_hello_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>

using gpuproxy::programs::Program;

int main() {
  Program program("printf_hello", gpuproxy::testing::kPrintfHelloPtx);
  CUfunction hello = program.function("hello");
  for (int launch = 0; launch < 2; ++launch) {
    std::printf("before launch %d\n", launch);
    program.run(hello, 2, 3, {&launch});
    std::printf("after launch %d\n", launch);
  }
  std::printf("printf_hello: PASSED\n");
  return 0;
}
