#pragma once
// Names and descriptions of CUresult codes, shared by the stub (cuGetErrorName/String) and the
// daemon's logs. The table is generated from the toolkit's cuda.h (protocol/cuda_api/).

#include <cuda.h>

#include <optional>
#include <string_view>

namespace gpuproxy::protocol {

// The lookups take the code as an int: a CUresult from an application may hold any integer, and
// an enum object holding a value outside its enumerators' range is undefined behaviour.

// "CUDA_ERROR_INVALID_VALUE" for CUDA_ERROR_INVALID_VALUE; nullopt for a value cuda.h lacks.
std::optional<std::string_view> cudaResultName(int code);

// A short human description ("invalid argument"); nullopt for a value cuda.h lacks.
std::optional<std::string_view> cudaResultDescription(int code);

// For logs: the name, or "CUresult(N)" for an unknown value.
std::string_view cudaResultNameOr(int code, std::string_view fallback);

// Whether `result` is one of the errors after which the driver's context is unusable and every
// later call in it fails the same way until the context is destroyed or reset (a kernel fault:
// "sticky" errors in CUDA's documentation). The daemon's backends poison the device with these;
// the stub keeps answering them for the context.
constexpr bool isStickyError(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
      return true;
    default:
      return false;
  }
}

}  // namespace gpuproxy::protocol
