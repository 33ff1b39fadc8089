#include "server/daemon/backend_select.hpp"

#include "server/backend/cuda/cuda_backend.hpp"
#include "server/backend/sim/sim_backend.hpp"

#include <utility>

namespace gpuproxy::server::backend {

BackendChoice selectBackend(const std::string& requested, const sim::SimOptions& simOptions,
                            const std::string& cudaDriver) {
  auto simulator = [&]() { return sim::newSimBackend(simOptions); };
  if (requested == "sim") return {simulator(), "sim backend requested"};

  std::string whyNot;
  auto cuda =
      cudaDriver.empty() ? cuda::newCudaBackend(whyNot) : cuda::newCudaBackend(whyNot, cudaDriver);
  if (cuda.ok()) return {std::move(cuda).value(), "a CUDA driver and GPU are present"};
  if (requested == "cuda") return {nullptr, "cuda backend unavailable: " + whyNot};
  return {simulator(), "no usable GPU (" + whyNot + "), using the simulator"};
}

}  // namespace gpuproxy::server::backend
