#pragma once
// Chooses the backend for --backend auto|cuda|sim and says why.

#include "server/backend/backend.hpp"
#include "server/backend/sim/sim_backend.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace gpuproxy::server::backend {

struct BackendChoice {
  std::unique_ptr<Backend> backend;  // null when the requested backend cannot run
  std::string reason;                // one line for the log: why this one, or why none
};

// `auto` takes `cuda` when a driver and at least one GPU are present, else `sim`, made with
// `simulator`.
// `cudaDriver` is the library the cuda backend loads (empty: libcuda.so.1).
BackendChoice selectBackend(const std::string& requested, const sim::SimOptions& simulator,
                            const std::string& cudaDriver = {});

}  // namespace gpuproxy::server::backend
