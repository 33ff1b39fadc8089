// cuGetProcAddress(_v2): how cudart (12+) and most frameworks find every other entry point. The
// answer must be the exact ABI variant for (base name, CUDA version the caller was built for,
// stream flavour) — handing cuCtxCreate_v4 to a caller built for CUDA 11.4 corrupts its stack.
// The table is generated from cuda.h and cudaTypedefs.h (protocol/cuda_api/gen.py). It is plain
// data, so this works before cuInit and needs no daemon.

#include <cuda.h>
#include <cudaProfiler.h>

#include <cstddef>
#include <cstring>
#include <iterator>

#include "client/stub/export.hpp"

namespace gpuproxy::client {
namespace {

struct ProcVariant {
  const char* symbol;
  int version;  // CUDA version that introduced this ABI (cudaTypedefs.h PFN_<base>_v<version>)
  int ordinal;  // 1 for the base name, N for <base>_vN
  bool perThreadStream;  // the _ptds/_ptsz twin of the same ordinal
  void* function;
};

struct ProcEntry {
  const char* base;
  const ProcVariant* variants;
  std::size_t count;
};

}  // namespace
}  // namespace gpuproxy::client

// Also #undefs cuda.h's renaming macros (cuGetProcAddress -> cuGetProcAddress_v2 among them),
// so the definitions below get their literal names.
#include "generated/proc_address_table.inc"

namespace gpuproxy::client {
namespace {

const ProcEntry* findBase(const char* symbol) {
  const ProcEntry* first = std::begin(kProcTable);
  const ProcEntry* last = std::end(kProcTable);
  while (first < last) {
    const ProcEntry* middle = first + (last - first) / 2;
    int order = std::strcmp(middle->base, symbol);
    if (order == 0) return middle;
    if (order < 0) {
      first = middle + 1;
    } else {
      last = middle;
    }
  }
  return nullptr;
}

// The newest ABI the caller's CUDA version knows; with the per-thread flag, that ABI's
// per-thread-default-stream twin where one exists for that version.
const ProcVariant* pickVariant(const ProcEntry& entry, int cudaVersion, bool perThread) {
  const ProcVariant* legacy = nullptr;
  const ProcVariant* ptds = nullptr;
  for (std::size_t i = 0; i < entry.count; ++i) {
    const ProcVariant& v = entry.variants[i];
    if (v.version > cudaVersion) continue;
    const ProcVariant*& best = v.perThreadStream ? ptds : legacy;
    if (best == nullptr || v.ordinal > best->ordinal) best = &v;
  }
  // A per-thread twin of an older ABI than the legacy pick would change the signature.
  if (perThread && ptds != nullptr && (legacy == nullptr || ptds->ordinal >= legacy->ordinal)) {
    return ptds;
  }
  return legacy != nullptr ? legacy : ptds;
}

CUresult lookUp(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  auto setStatus = [status](CUdriverProcAddressQueryResult value) {
    if (status != nullptr) *status = value;
  };
  const ProcEntry* entry = findBase(symbol);
  if (entry == nullptr) {
    setStatus(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  // DEFAULT and LEGACY_STREAM both mean the legacy default stream for a driver-API caller;
  // per-thread callers ask explicitly (cuda.h's cuGetProcAddress_v2_ptsz wrapper sets the flag).
  bool perThread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcVariant* variant = pickVariant(*entry, cudaVersion, perThread);
  if (variant == nullptr) {
    setStatus(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = variant->function;
  setStatus(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace gpuproxy::client

GPUPROXY_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  try {
    return gpuproxy::client::lookUp(symbol, pfn, cudaVersion, flags, symbolStatus);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// The CUDA 11.3 form, without the status out-parameter.
GPUPROXY_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags) {
  try {
    return gpuproxy::client::lookUp(symbol, pfn, cudaVersion, flags, nullptr);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}
