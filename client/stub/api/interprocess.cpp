// Interprocess handles: cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle,
// cuIpcGetEventHandle, cuIpcOpenEventHandle (interprocess.hpp). The daemon makes every handle and
// decides who may open it (processes of the same tenant, on the same device; protocol/
// gpuproxy.capnp, Session.ipcExportMemory).

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "client/stub/api/interprocess.hpp"
#include "client/stub/api/memory_pools.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toHandle;
using gpuproxy::stub::toResult;

namespace gpuproxy::stub {

namespace {

// A handle: the tag "gpxipc" and its kind and format version, the device index, the token; zeros
// after.
constexpr std::array<char, 6> kTag = {'g', 'p', 'x', 'i', 'p', 'c'};
constexpr char kFormat = '1';
constexpr std::size_t kDeviceOffset = 8;
constexpr std::size_t kTokenOffset = 16;
static_assert(sizeof(CUipcMemHandle) == kIpcHandleBytes);
static_assert(sizeof(CUipcEventHandle) == kIpcHandleBytes);
static_assert(sizeof(CUmemPoolPtrExportData) == kIpcHandleBytes);
static_assert(kTokenOffset + sizeof(IpcHandle::token) <= kIpcHandleBytes);

// The daemon's answer to an export (ipcExportMemory, ipcExportEvent, memExport), into `handle`.
template <typename Response>
CUresult exportedHandle(const Response& response, IpcHandle& handle) {
  const CUresult result = toResult(response.getResult());
  capnp::Data::Reader token = response.getToken();
  if (result != CUDA_SUCCESS) return result;
  if (token.size() != handle.token.size()) return CUDA_ERROR_UNKNOWN;
  handle.device = response.getDevice();
  std::memcpy(handle.token.data(), token.begin(), token.size());
  return CUDA_SUCCESS;
}

// How often each opened mapping has been opened: the stub knows the range as this process's
// memory until it is closed as often (the daemon counts the same).
std::mutex mappingsMutex;
std::map<CUdeviceptr, unsigned> mappings;

}  // namespace

int sealedFileHolding(const char* name, const void* bytes, std::size_t size) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::write(fd, bytes, size) != static_cast<ssize_t>(size) ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool readSealedFile(int fd, void* out, std::size_t size) {
  return ::pread(fd, out, size, 0) == static_cast<ssize_t>(size);
}

capnp::Data::Reader ipcTokenData(const IpcHandle& handle) {
  return {reinterpret_cast<const capnp::byte*>(handle.token.data()), handle.token.size()};
}

void writeIpcHandle(char* out, IpcHandle::Kind kind, const IpcHandle& handle) {
  std::memset(out, 0, kIpcHandleBytes);
  std::memcpy(out, kTag.data(), kTag.size());
  out[kTag.size()] = static_cast<char>(kind);
  out[kTag.size() + 1] = kFormat;
  std::memcpy(out + kDeviceOffset, &handle.device, sizeof(handle.device));
  std::memcpy(out + kTokenOffset, handle.token.data(), handle.token.size());
}

bool readIpcHandle(const char* in, IpcHandle::Kind kind, IpcHandle& handle) {
  if (std::memcmp(in, kTag.data(), kTag.size()) != 0 ||
      in[kTag.size()] != static_cast<char>(kind) || in[kTag.size() + 1] != kFormat) {
    return false;
  }
  std::memcpy(&handle.device, in + kDeviceOffset, sizeof(handle.device));
  std::memcpy(handle.token.data(), in + kTokenOffset, handle.token.size());
  return true;
}

CUresult exportIpcMemory(Runtime& runtime, CUdeviceptr pointer, IpcHandle& handle) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.ipcExportMemoryRequest();
    request.setPointer(pointer);
    return request.send().then(
        [&handle](auto response) { return exportedHandle(response, handle); });
  });
}

CUresult exportPhysicalMemory(Runtime& runtime, std::uint64_t physical, IpcHandle& handle) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.memExportRequest();
    request.setHandle(physical);
    return request.send().then(
        [&handle](auto response) { return exportedHandle(response, handle); });
  });
}

CUresult openIpcMemory(Runtime& runtime, std::uint64_t context, const IpcHandle& handle,
                       CUdeviceptr& pointer) {
  struct Reply {
    CUresult result;
    std::uint64_t pointer;
    std::uint64_t bytes;
  };
  Reply reply = runtime.call([&](Session::Client& session) {
    auto request = session.ipcOpenMemoryRequest();
    request.setContext(context);
    request.setDevice(handle.device);
    request.setToken(ipcTokenData(handle));
    return request.send().then([](auto response) {
      return Reply{toResult(response.getResult()), response.getPointer(), response.getBytes()};
    });
  });
  if (reply.result != CUDA_SUCCESS) return reply.result;
  std::lock_guard lock(mappingsMutex);
  unsigned& references = mappings[reply.pointer];
  // A mapping whose context was destroyed went with it, in the daemon as here.
  if (!runtime.allocationContaining(reply.pointer)) {
    references = 0;
    runtime.addAllocation(reply.pointer, reply.bytes, context);
  }
  ++references;
  pointer = static_cast<CUdeviceptr>(reply.pointer);
  return CUDA_SUCCESS;
}

CUresult closeIpcMemory(Runtime& runtime, CUdeviceptr pointer) {
  CUresult result = runtime.call([&](Session::Client& session) {
    auto request = session.ipcCloseMemoryRequest();
    request.setPointer(pointer);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
  if (result != CUDA_SUCCESS) return result;
  std::lock_guard lock(mappingsMutex);
  auto found = mappings.find(pointer);
  if (found != mappings.end() && --found->second == 0) {
    mappings.erase(found);
    runtime.forgetAllocation(pointer);
  }
  return CUDA_SUCCESS;
}

CUresult exportIpcEvent(Runtime& runtime, std::uint64_t event, IpcHandle& handle) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.ipcExportEventRequest();
    request.setEvent(event);
    return request.send().then(
        [&handle](auto response) { return exportedHandle(response, handle); });
  });
}

}  // namespace gpuproxy::stub

using gpuproxy::stub::IpcHandle;

GPUPROXY_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // As the driver: a pool's memory is shared through its pool (cuMemPoolExportPointer).
    if (gpuproxy::stub::fromPool(dptr)) return CUDA_ERROR_INVALID_VALUE;
    IpcHandle handle;
    if (CUresult exported = gpuproxy::stub::exportIpcMemory(runtime, dptr, handle);
        exported != CUDA_SUCCESS) {
      return exported;
    }
    gpuproxy::stub::writeIpcHandle(pHandle->reserved, IpcHandle::Kind::kMemory, handle);
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult openMemHandle(const char* entryPoint, CUdeviceptr* pdptr, const CUipcMemHandle& handle,
                       unsigned int flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    IpcHandle contents;
    if (!gpuproxy::stub::readIpcHandle(handle.reserved, IpcHandle::Kind::kMemory, contents)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return gpuproxy::stub::openIpcMemory(runtime, context, contents, *pdptr);
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                            unsigned int Flags) {
  return openMemHandle(__func__, pdptr, handle, Flags);
}

GPUPROXY_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                               unsigned int Flags) {
  return openMemHandle(__func__, pdptr, handle, Flags);
}

GPUPROXY_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return guarded(__func__,
                 [&](Runtime& runtime) { return gpuproxy::stub::closeIpcMemory(runtime, dptr); });
}

GPUPROXY_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!runtime.eventContext(handleValue(event))) return CUDA_ERROR_INVALID_HANDLE;
    IpcHandle handle;
    CUresult result = gpuproxy::stub::exportIpcEvent(runtime, handleValue(event), handle);
    if (result != CUDA_SUCCESS) return result;
    gpuproxy::stub::writeIpcHandle(pHandle->reserved, IpcHandle::Kind::kEvent, handle);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    IpcHandle contents;
    if (!gpuproxy::stub::readIpcHandle(handle.reserved, IpcHandle::Kind::kEvent, contents)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct Reply {
      CUresult result;
      std::uint64_t event;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.ipcOpenEventRequest();
      request.setContext(context);
      request.setDevice(contents.device);
      request.setToken(gpuproxy::stub::ipcTokenData(contents));
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getEvent()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.addEvent(reply.event, context);
    *phEvent = toHandle<CUevent>(reply.event);
    return CUDA_SUCCESS;
  });
}
