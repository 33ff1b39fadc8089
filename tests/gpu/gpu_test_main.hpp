#pragma once
// The main() of every test in tests/gpu/: opens the cuda backend once, and exits 77 (ctest's skip
// code, with the reason on stdout) where there is no driver or no GPU.

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "server/backend/backend.hpp"
#include "server/backend/cuda/cuda_backend.hpp"

namespace gpuproxy::testing {

// Runs the tests with `backend` pointing at the opened cuda backend meanwhile.
inline int runGpuTests(int argc, char** argv, server::backend::Backend*& backend) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string whyNot;
  auto opened = server::cuda::newCudaBackend(whyNot);
  if (!opened.ok()) {
    std::printf("SKIPPED: no GPU: %s\n", whyNot.c_str());
    std::fflush(stdout);
    return 77;
  }
  std::unique_ptr<server::backend::Backend> owned = std::move(opened).value();
  backend = owned.get();
  const int failed = RUN_ALL_TESTS();
  backend = nullptr;
  return failed;
}

}  // namespace gpuproxy::testing
