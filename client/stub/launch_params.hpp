#pragma once
// Packing cuLaunchKernel's arguments into the flat buffer the daemon expects, at the offsets the
// kernel's layout gives. Header-only and free of stub state so that unit tests can exercise it.

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace gpuproxy::stub {

struct ParameterSlot {
  std::uint32_t offset = 0;
  std::uint32_t size = 0;
};

// False when a layout (as the daemon reported it) has a parameter outside its own buffer; the
// stub then refuses to launch rather than write past the end.
inline bool layoutIsConsistent(std::span<const ParameterSlot> slots, std::uint32_t parameterBytes) {
  for (const ParameterSlot& slot : slots) {
    if (std::uint64_t{slot.offset} + slot.size > parameterBytes) return false;
  }
  return true;
}

// Fills `buffer` (resized to parameterBytes) from either `kernelParams` (one pointer per
// parameter) or `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE, ended by CU_LAUNCH_PARAM_END), as
// cuLaunchKernel documents. Returns CUDA_ERROR_INVALID_VALUE for any misuse.
inline CUresult packKernelParameters(std::span<const ParameterSlot> slots,
                                     std::uint32_t parameterBytes, void** kernelParams,
                                     void** extra, std::vector<std::byte>& buffer) {
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  buffer.assign(parameterBytes, std::byte{0});
  if (kernelParams != nullptr) {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (kernelParams[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (std::uint64_t{slots[i].offset} + slots[i].size > parameterBytes) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      std::memcpy(buffer.data() + slots[i].offset, kernelParams[i], slots[i].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra != nullptr) {
    const void* source = nullptr;
    const std::size_t* size = nullptr;
    // A bounded walk: a list without CU_LAUNCH_PARAM_END is the caller's bug, not a reason to
    // read memory forever.
    constexpr std::size_t kMaxEntries = 64;
    std::size_t i = 0;
    for (; i < kMaxEntries && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        source = extra[i + 1];
      } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        size = static_cast<const std::size_t*>(extra[i + 1]);
      } else {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (i >= kMaxEntries) return CUDA_ERROR_INVALID_VALUE;
    if (parameterBytes == 0 && source == nullptr && size == nullptr) return CUDA_SUCCESS;
    if (source == nullptr || size == nullptr || *size != parameterBytes) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::memcpy(buffer.data(), source, parameterBytes);
    return CUDA_SUCCESS;
  }
  // Neither: fine only for a kernel without parameters.
  return slots.empty() && parameterBytes == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace gpuproxy::stub
