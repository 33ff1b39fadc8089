// Virtual memory management (cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease,
// cuMemMap, cuMemUnmap, cuMemSetAccess): the session's routing. A reservation is found by address,
// physical memory by its handle (whose device is in it); what each client holds, and the rules,
// are its GpuClient's (server/gpu/client_virtual_memory.hpp).

#include "server/session/client_session.hpp"

#include "server/session/call_answers.hpp"

#include <spdlog/spdlog.h>

namespace gpuproxy::server {

GpuClient* ClientSession::clientReserving(CUdeviceptr address) {
  for (auto& [device, client] : clients_) {
    if (client->reservesAddress(address)) return client.get();
  }
  return nullptr;
}

kj::Promise<void> ClientSession::memAddressReserve(MemAddressReserveContext context) {
  auto params = context.getParams();
  return answerCreated(
      context, clientFor(params.getContext(), HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [&](GpuClient& client) {
        return client.reserveAddresses(params.getContext(), params.getBytes(),
                                       params.getAlignment());
      },
      [](auto& results, CUdeviceptr pointer) { results.setPointer(pointer); });
}

kj::Promise<void> ClientSession::memAddressFree(MemAddressFreeContext context) {
  auto params = context.getParams();
  return answerNow(context, clientReserving(params.getPointer()), CUDA_ERROR_INVALID_VALUE,
                   [&](GpuClient& client) {
                     return client.freeAddresses(params.getPointer(), params.getBytes());
                   });
}

kj::Promise<void> ClientSession::memCreate(MemCreateContext context) {
  auto params = context.getParams();
  const std::uint32_t ordinal = params.getDevice();
  const std::uint64_t bytes = params.getBytes();
  // Made on the device, in no context; once the GPU serves, as a context is (a reset under way
  // would take it).
  return whenDeviceServes(ordinal).then([this, context, ordinal, bytes]() mutable {
    GpuClient* client = clientForDevice(ordinal);
    if (client == nullptr) {
      context.getResults().setResult(CUDA_ERROR_INVALID_DEVICE);
      return kj::Promise<void>(kj::READY_NOW);
    }
    noteDeviceUsed(client->deviceIndex());
    return client->createPhysicalMemory(bytes).then(
        [context](backend::Result<Handle> handle) mutable {
          auto results = context.getResults();
          results.setResult(handle.code());
          if (handle.ok()) results.setHandle(handle.value());
        });
  });
}

kj::Promise<void> ClientSession::memRelease(MemReleaseContext context) {
  const Handle handle = context.getParams().getHandle();
  return answerNow(context, clientFor(handle, HandleKind::kPhysicalMemory),
                   CUDA_ERROR_INVALID_VALUE,
                   [&](GpuClient& client) { return client.releasePhysicalMemory(handle); });
}

kj::Promise<void> ClientSession::memMap(MemMapContext context) {
  auto params = context.getParams();
  GpuClient* owner = clientFor(params.getHandle(), HandleKind::kPhysicalMemory);
  GpuClient* reserving = clientReserving(params.getPointer());
  if (owner != nullptr && reserving != nullptr && owner != reserving) {
    // Memory of one GPU behind addresses reserved on another: through gpuproxy no two devices are
    // peers, so no kernel could reach it where it is mapped.
    spdlog::info(
        "pid {}: mapping memory of device {} into addresses reserved on device {} is not "
        "supported (through gpuproxy no two devices are peers)",
        stats_->identity.pid, owner->deviceIndex(), reserving->deviceIndex());
    context.getResults().setResult(CUDA_ERROR_NOT_SUPPORTED);
    return kj::READY_NOW;
  }
  return answerNow(context, owner, CUDA_ERROR_INVALID_VALUE, [&](GpuClient& client) {
    return client.mapMemory(params.getPointer(), params.getBytes(), params.getOffset(),
                            params.getHandle());
  });
}

kj::Promise<void> ClientSession::memUnmap(MemUnmapContext context) {
  auto params = context.getParams();
  return answerWhenDone(context, clientReserving(params.getPointer()), CUDA_ERROR_INVALID_VALUE,
                        [&](GpuClient& client) {
                          return client.unmapMemory(params.getPointer(), params.getBytes());
                        });
}

kj::Promise<void> ClientSession::memSetAccess(MemSetAccessContext context) {
  auto params = context.getParams();
  const std::uint32_t flags = params.getFlags();
  if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    context.getResults().setResult(flags == CU_MEM_ACCESS_FLAGS_PROT_READ
                                       ? CUDA_ERROR_NOT_SUPPORTED
                                       : CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  return answerNow(context, clientReserving(params.getPointer()), CUDA_ERROR_INVALID_VALUE,
                   [&](GpuClient& client) {
                     return client.setMemoryAccess(params.getPointer(), params.getBytes(),
                                                   flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
                   });
}

}  // namespace gpuproxy::server
