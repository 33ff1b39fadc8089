#pragma once
// What every test in tests/gpu/ shares: its main(), which opens the cuda backend once and exits
// 77 (ctest's skip code, with the reason on stdout) where there is no driver or no GPU; the test
// kernels' image; packing kernel arguments at the offsets the backend reports.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/backend/backend.hpp"
#include "server/backend/cuda/cuda_backend.hpp"

#ifdef GPUPROXY_HAVE_TEST_KERNELS
#include "test_kernels_ptx.hpp"
#endif

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

#ifdef GPUPROXY_HAVE_TEST_KERNELS
inline std::span<const std::byte> testKernelsImage() {
  static const std::string_view ptx{kTestKernelsPtx};
  return std::as_bytes(std::span(ptx.data(), ptx.size()));
}
#endif

// Packs arguments at the offsets the backend reported, checking each size on the way.
class ParameterPacker {
public:
  explicit ParameterPacker(const server::backend::FunctionInfo& info)
      : info_(info), buffer_(info.parameterBytes) {}

  template <typename T>
  ParameterPacker& add(const T& value) {
    if (next_ >= info_.parameters.size()) {
      ADD_FAILURE() << "more arguments than the kernel has parameters";
      return *this;
    }
    const server::backend::KernelParameter& parameter = info_.parameters[next_++];
    EXPECT_EQ(parameter.size, sizeof(T)) << "parameter " << next_ - 1;
    if (parameter.size == sizeof(T) && parameter.offset + sizeof(T) <= buffer_.size()) {
      std::memcpy(buffer_.data() + parameter.offset, &value, sizeof(T));
    }
    return *this;
  }

  std::span<const std::byte> bytes() const {
    EXPECT_EQ(next_, info_.parameters.size()) << "fewer arguments than parameters";
    return buffer_;
  }

private:
  const server::backend::FunctionInfo& info_;
  std::vector<std::byte> buffer_;
  std::size_t next_ = 0;
};

}  // namespace gpuproxy::testing
