#pragma once
// Names and descriptions of CUresult codes, shared by the stub (cuGetErrorName/String) and the
// daemon's logs. The table is generated from the toolkit's cuda.h (protocol/cuda_api/).

#include <cuda.h>

#include <optional>
#include <string_view>

namespace gpuproxy::protocol {

// "CUDA_ERROR_INVALID_VALUE" for CUDA_ERROR_INVALID_VALUE; nullopt for a value cuda.h lacks.
std::optional<std::string_view> cudaResultName(CUresult result);

// A short human description ("invalid argument"); nullopt for a value cuda.h lacks.
std::optional<std::string_view> cudaResultDescription(CUresult result);

// For logs: the name, or "CUresult(N)" for an unknown value.
std::string_view cudaResultNameOr(CUresult result, std::string_view fallback);

}  // namespace gpuproxy::protocol
