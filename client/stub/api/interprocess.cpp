// Interprocess handles: cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle,
// cuIpcGetEventHandle, cuIpcOpenEventHandle. The daemon makes every handle and decides who may
// open it (processes of the same tenant, on the same device); a handle's bytes here are only a
// tag, the daemon's device index and its unguessable token (protocol/gpuproxy.capnp,
// Session.ipcExportMemory).

#include <cuda.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toHandle;
using gpuproxy::stub::toResult;

namespace {

// A handle's bytes (CUipcMemHandle and CUipcEventHandle are both 64 opaque bytes): a tag naming
// the kind, the daemon's device index, the token; zeros after.
constexpr std::size_t kTokenBytes = 16;
constexpr std::array<char, 8> kMemoryTag = {'g', 'p', 'x', 'i', 'p', 'c', 'm', '1'};
constexpr std::array<char, 8> kEventTag = {'g', 'p', 'x', 'i', 'p', 'c', 'e', '1'};
constexpr std::size_t kDeviceOffset = 8;
constexpr std::size_t kTokenOffset = 16;
static_assert(sizeof(CUipcMemHandle) == sizeof(CUipcEventHandle));
static_assert(kTokenOffset + kTokenBytes <= sizeof(CUipcMemHandle));

struct HandleContents {
  std::uint32_t device = 0;
  std::array<std::byte, kTokenBytes> token{};
};

void writeHandle(char* out, const std::array<char, 8>& tag, std::uint32_t device,
                 capnp::Data::Reader token) {
  std::memset(out, 0, sizeof(CUipcMemHandle));
  std::memcpy(out, tag.data(), tag.size());
  std::memcpy(out + kDeviceOffset, &device, sizeof(device));
  std::memcpy(out + kTokenOffset, token.begin(), std::min(token.size(), kTokenBytes));
}

// Whether `in` is a handle of the kind `tag` names; a handle is the application's bytes, so
// anything else is CUDA_ERROR_INVALID_VALUE.
bool readHandle(const char* in, const std::array<char, 8>& tag, HandleContents& contents) {
  if (std::memcmp(in, tag.data(), tag.size()) != 0) return false;
  std::memcpy(&contents.device, in + kDeviceOffset, sizeof(contents.device));
  std::memcpy(contents.token.data(), in + kTokenOffset, kTokenBytes);
  return true;
}

capnp::Data::Reader tokenData(const HandleContents& contents) {
  return {reinterpret_cast<const capnp::byte*>(contents.token.data()), contents.token.size()};
}

// How often each opened mapping has been opened: the stub knows the range as this process's
// memory until it is closed as often (the daemon counts the same).
std::mutex mappingsMutex;
std::map<CUdeviceptr, unsigned> mappings;

struct ExportReply {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::uint32_t device = 0;
  std::array<std::byte, kTokenBytes> token{};
};

template <typename Response>
ExportReply exportReplyOf(const Response& response) {
  ExportReply reply{toResult(response.getResult()), response.getDevice()};
  capnp::Data::Reader token = response.getToken();
  std::memcpy(reply.token.data(), token.begin(), std::min(token.size(), kTokenBytes));
  return reply;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ExportReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.ipcExportMemoryRequest();
      request.setPointer(dptr);
      return request.send().then([](auto response) { return exportReplyOf(response); });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    writeHandle(pHandle->reserved, kMemoryTag, reply.device,
                {reinterpret_cast<const capnp::byte*>(reply.token.data()), kTokenBytes});
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
    HandleContents contents;
    if (!readHandle(handle.reserved, kMemoryTag, contents)) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct Reply {
      CUresult result;
      std::uint64_t pointer;
      std::uint64_t bytes;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.ipcOpenMemoryRequest();
      request.setContext(context);
      request.setDevice(contents.device);
      request.setToken(tokenData(contents));
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getPointer(), response.getBytes()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    {
      std::lock_guard lock(mappingsMutex);
      unsigned& references = mappings[reply.pointer];
      // A mapping whose context was destroyed went with it, in the daemon as here.
      if (!runtime.allocationContaining(reply.pointer)) {
        references = 0;
        runtime.addAllocation(reply.pointer, reply.bytes, context);
      }
      ++references;
    }
    *pdptr = static_cast<CUdeviceptr>(reply.pointer);
    return CUDA_SUCCESS;
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
  return guarded(__func__, [&](Runtime& runtime) {
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.ipcCloseMemoryRequest();
      request.setPointer(dptr);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    std::lock_guard lock(mappingsMutex);
    auto found = mappings.find(dptr);
    if (found != mappings.end() && --found->second == 0) {
      mappings.erase(found);
      runtime.forgetAllocation(dptr);
    }
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!runtime.eventContext(handleValue(event))) return CUDA_ERROR_INVALID_HANDLE;
    ExportReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.ipcExportEventRequest();
      request.setEvent(handleValue(event));
      return request.send().then([](auto response) { return exportReplyOf(response); });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    writeHandle(pHandle->reserved, kEventTag, reply.device,
                {reinterpret_cast<const capnp::byte*>(reply.token.data()), kTokenBytes});
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    HandleContents contents;
    if (!readHandle(handle.reserved, kEventTag, contents)) return CUDA_ERROR_INVALID_VALUE;
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
      request.setToken(tokenData(contents));
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
