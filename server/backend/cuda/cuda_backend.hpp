#pragma once
// The `cuda` backend: the real CUDA driver, loaded with dlopen at run time.

#include <memory>
#include <string>

#include "server/backend/backend.hpp"

namespace gpuproxy::server::cuda {

// Loads `library`, initialises the driver and counts its devices. On failure returns the error
// and sets `whyNot` to one line for the operator: the dlopen error, the failing cuInit's error
// name, or that there are no devices. `--backend auto` falls back to sim on failure and logs it.
backend::Result<std::unique_ptr<backend::Backend>> newCudaBackend(
    std::string& whyNot, const std::string& library = "libcuda.so.1");

}  // namespace gpuproxy::server::cuda
