#pragma once
// The answer of every CUDA entry point the stub does not implement (docs/adding-a-cuda-call.md):
// the generated definitions in unsupported_entry_points.cpp all end up here.

#include <cuda.h>

namespace gpuproxy::client {

// Returns CUDA_ERROR_NOT_SUPPORTED. The first call for each `name` writes
// "gpuproxy: <name> is not supported" to stderr (client/stub/log.hpp, warn level), so that a
// user learns which call stopped their program without a flood from a loop;
// GPUPROXY_LOG_LEVEL=off silences it. Safe from any thread and before cuInit.
CUresult reportUnsupported(const char* name) noexcept;

}  // namespace gpuproxy::client
