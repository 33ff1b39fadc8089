// Without a usable driver the cuda backend must fail cleanly and say why, so that
// `gpuproxyd --backend auto` can log the reason and use the sim backend. Runs everywhere.

#include <gtest/gtest.h>

#include <string>

#include "server/backend/cuda/cuda_backend.hpp"

namespace gpuproxy::server::cuda {
namespace {

TEST(CudaBackendUnavailable, MissingLibraryFailsWithTheLoaderError) {
  std::string whyNot;
  auto backend = newCudaBackend(whyNot, "/nonexistent/libcuda.so.1");
  EXPECT_FALSE(backend.ok());
  EXPECT_NE(backend.code(), CUDA_SUCCESS);
  EXPECT_EQ(backend.value(), nullptr);
  // The operator needs to know what was tried and what the loader said.
  EXPECT_NE(whyNot.find("/nonexistent/libcuda.so.1"), std::string::npos) << whyNot;
  EXPECT_NE(whyNot.find("cannot load"), std::string::npos) << whyNot;
  EXPECT_EQ(whyNot.find('\n'), std::string::npos) << "one line: " << whyNot;
}

TEST(CudaBackendUnavailable, LibraryThatIsNotADriverIsRefused) {
  // Present on every glibc system, and certainly not a CUDA driver.
  std::string whyNot;
  auto backend = newCudaBackend(whyNot, "libm.so.6");
  EXPECT_FALSE(backend.ok());
  EXPECT_NE(whyNot.find("cuGetProcAddress_v2"), std::string::npos) << whyNot;
  EXPECT_EQ(whyNot.find('\n'), std::string::npos) << "one line: " << whyNot;
}

}  // namespace
}  // namespace gpuproxy::server::cuda
