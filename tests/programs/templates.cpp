// Templated kernels, instantiated for several types and functors, each found by its mangled
// name; checked against the CPU.
#include "templates_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <algorithm>
#include <cstdio>

using gpuproxy::programs::Program;

namespace {

template <typename T>
bool saxpy(const Program& program, const char* kernel, T a) {
  constexpr int kCount = 5000;
  std::vector<T> x(kCount);
  std::vector<T> y(kCount);
  for (int i = 0; i < kCount; ++i) {
    x[i] = static_cast<T>(i % 17);
    y[i] = static_cast<T>(i % 5);
  }
  CUdeviceptr deviceX = program.upload(x);
  CUdeviceptr deviceY = program.upload(y);
  int count = kCount;
  program.run(program.function(kernel), (kCount + 127) / 128, 128,
              {&a, &deviceX, &deviceY, &count});
  const std::vector<T> gpu = program.download<T>(deviceY, kCount);
  program.free(deviceX);
  program.free(deviceY);
  bool ok = true;
  for (int i = 0; i < kCount; ++i) ok = ok && gpu[i] == a * x[i] + y[i];
  std::printf("%s: y[4999] = %g (CPU %g)\n", kernel, static_cast<double>(gpu.back()),
              static_cast<double>(a * x.back() + y.back()));
  return ok;
}

template <typename T, typename Functor>
bool transform(const Program& program, const char* kernel, std::vector<T> data, Functor cpu) {
  CUdeviceptr device = program.upload(data);
  int count = static_cast<int>(data.size());
  struct Empty {
  } functor;  // the functor parameter is an empty struct: one byte
  program.run(program.function(kernel), 4, 128, {&device, &count, &functor});
  const std::vector<T> gpu = program.download<T>(device, data.size());
  program.free(device);
  for (T& value : data) value = cpu(value);
  std::printf("%s: %zu elements, last %g\n", kernel, gpu.size(), static_cast<double>(gpu.back()));
  return gpu == data;
}

}  // namespace

int main() {
  Program program("templates", gpuproxy::testing::kTemplatesPtx);
  std::vector<int> integers(3000);
  for (int i = 0; i < 3000; ++i) integers[i] = i - 1500;
  std::vector<float> floats(3000);
  for (int i = 0; i < 3000; ++i) floats[i] = static_cast<float>(i % 250) - 50.5f;
  const bool ok =
      saxpy<float>(program, "_Z5saxpyIfEvT_PKS0_PS0_i", 2.5f) &&
      saxpy<double>(program, "_Z5saxpyIdEvT_PKS0_PS0_i", -0.125) &&
      saxpy<int>(program, "_Z5saxpyIiEvT_PKS0_PS0_i", 7) &&
      transform(program, "_Z9transformIi6SquareEvPT_iT0_", integers, [](int v) { return v * v; }) &&
      transform(program, "_Z9transformIf5ClampEvPT_iT0_", floats,
                [](float v) { return std::clamp(v, 0.0f, 100.0f); });
  std::printf("templates: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
