#pragma once
// Interprocess handles as the stub writes and reads them, and the daemon calls behind them
// (interprocess.cpp): shared by the cuIpc* entry points and by memory pools' exported pointers
// (cuMemPoolExportPointer, memory_pools.cpp) and physical memory's shareable handles
// (cuMemExportToShareableHandle, virtual_memory.cpp). A handle's bytes are a tag naming its kind,
// the daemon's device index and the daemon's unguessable token; only the daemon can resolve it,
// and only for the tenant that made it.

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

struct IpcHandle {
  enum class Kind : char { kMemory = 'm', kEvent = 'e', kPoolPointer = 'p', kPhysicalMemory = 'v' };
  std::uint32_t device = 0;  // the daemon's index
  std::array<std::byte, 16> token{};
};

// The 64 bytes of a handle (CUipcMemHandle, CUipcEventHandle, CUmemPoolPtrExportData).
inline constexpr std::size_t kIpcHandleBytes = 64;
void writeIpcHandle(char* out, IpcHandle::Kind kind, const IpcHandle& handle);
// False for bytes that are no handle of `kind` (CUDA_ERROR_INVALID_VALUE to the application).
bool readIpcHandle(const char* in, IpcHandle::Kind kind, IpcHandle& handle);
// The token, as the daemon's calls carry it.
capnp::Data::Reader ipcTokenData(const IpcHandle& handle);

// What a shareable handle of type CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is (a memory pool's,
// physical memory's): a sealed memfd holding `size` bytes, which the application passes on as it
// likes. The bytes grant nothing by themselves: the daemon checks every import. -1 when no file
// can be made.
int sealedFileHolding(const char* name, const void* bytes, std::size_t size);
// The first `size` bytes of such a file; false for a descriptor that holds fewer.
bool readSealedFile(int fd, void* out, std::size_t size);

// The allocation holding `pointer`, exported by the daemon.
CUresult exportIpcMemory(Runtime& runtime, CUdeviceptr pointer, IpcHandle& handle);
// The exported allocation mapped for this process in `context`: `pointer` is its start. The
// mapping becomes this process's memory in the runtime's tables, counted once per open.
CUresult openIpcMemory(Runtime& runtime, std::uint64_t context, const IpcHandle& handle,
                       CUdeviceptr& pointer);
// One open given back; the last leaves the runtime's tables.
CUresult closeIpcMemory(Runtime& runtime, CUdeviceptr pointer);
// An event made with CU_EVENT_INTERPROCESS, exported by the daemon.
CUresult exportIpcEvent(Runtime& runtime, std::uint64_t event, IpcHandle& handle);
// Physical memory (a cuMemCreate handle the daemon knows), exported by the daemon.
CUresult exportPhysicalMemory(Runtime& runtime, std::uint64_t physical, IpcHandle& handle);

}  // namespace gpuproxy::stub
