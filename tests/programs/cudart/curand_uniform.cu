// cuRAND's host API, a closed NVIDIA library with its own kernels, through the stub: uniform
// numbers are generated on the device, they lie in (0, 1] with the mean a uniform distribution
// has, and the same seed gives the same numbers again. Ends "curand_uniform: PASSED".
#include <cuda_runtime.h>
#include <curand.h>

#include <cstdio>
#include <vector>

namespace {

bool generate(unsigned long long seed, std::vector<float>& out) {
  float* device = nullptr;
  if (cudaMalloc(&device, out.size() * sizeof(float)) != cudaSuccess) return false;
  curandGenerator_t generator;
  bool ok = curandCreateGenerator(&generator, CURAND_RNG_PSEUDO_DEFAULT) == CURAND_STATUS_SUCCESS &&
            curandSetPseudoRandomGeneratorSeed(generator, seed) == CURAND_STATUS_SUCCESS &&
            curandGenerateUniform(generator, device, out.size()) == CURAND_STATUS_SUCCESS &&
            cudaMemcpy(out.data(), device, out.size() * sizeof(float), cudaMemcpyDeviceToHost) ==
                cudaSuccess;
  curandDestroyGenerator(generator);
  cudaFree(device);
  return ok;
}

}  // namespace

int main() {
  std::vector<float> first(100000);
  std::vector<float> again(first.size());
  if (!generate(1234, first) || !generate(1234, again)) {
    std::printf("FAILED: a cuRAND or CUDA call failed\n");
    return 1;
  }
  double sum = 0;
  for (float value : first) {
    if (!(value > 0.0f && value <= 1.0f)) {
      std::printf("FAILED: %f is outside (0, 1]\n", value);
      return 1;
    }
    sum += value;
  }
  const double mean = sum / static_cast<double>(first.size());
  std::printf("mean %.4f, same seed same numbers: %s\n", mean, first == again ? "yes" : "no");
  if (mean < 0.49 || mean > 0.51 || first != again) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("curand_uniform: PASSED\n");
  return 0;
}
