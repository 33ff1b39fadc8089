// cuGetErrorName / cuGetErrorString, answered locally from the table generated from cuda.h.

#include <cuda.h>

#include <cstring>
#include <optional>
#include <string_view>

#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "protocol/cuda_result.hpp"

namespace {

// The real driver's contract: a NULL output is CUDA_ERROR_INVALID_VALUE; an unknown code also
// is, and sets *pStr to NULL so callers that print it unconditionally do not print garbage.
CUresult answer(std::optional<std::string_view> text, const char** pStr) noexcept {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!text) {
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The table's views point at NUL-terminated string literals (protocol/cuda_result.hpp).
  *pStr = text->data();
  return CUDA_SUCCESS;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  try {
    return answer(gpuproxy::protocol::cudaResultName(gpuproxy::stub::enumValue(error)), pStr);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

GPUPROXY_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  try {
    return answer(gpuproxy::protocol::cudaResultDescription(gpuproxy::stub::enumValue(error)),
                  pStr);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}
