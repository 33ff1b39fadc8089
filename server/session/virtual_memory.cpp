// Virtual memory management (cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease,
// cuMemMap, cuMemUnmap, cuMemSetAccess): the session's routing. A reservation is found by address,
// physical memory by its handle (whose device is in it); what each client holds, and the rules,
// are its GpuClient's (server/gpu/client_virtual_memory.hpp).

#include "server/session/client_session.hpp"

#include "server/session/call_answers.hpp"

#include <spdlog/spdlog.h>

namespace gpuproxy::server {

kj::Promise<GpuClient*> ClientSession::clientReserving(CUdeviceptr address) {
  return firstClientWhere([address](GpuClient& client) { return client.reservesAddress(address); });
}

kj::Promise<void> ClientSession::memAddressReserve(MemAddressReserveContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  return answerCreated(
      context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [handle, bytes = params.getBytes(), alignment = params.getAlignment()](GpuClient& client) {
        return client.reserveAddresses(handle, bytes, alignment);
      },
      [](auto& results, CUdeviceptr pointer) { results.setPointer(pointer); });
}

kj::Promise<void> ClientSession::memAddressFree(MemAddressFreeContext context) {
  auto params = context.getParams();
  const CUdeviceptr pointer = params.getPointer();
  const std::uint64_t bytes = params.getBytes();
  return clientReserving(pointer).then([context, pointer, bytes](GpuClient* client) mutable {
    return answerFromGpu(
        context, client, CUDA_ERROR_INVALID_VALUE,
        [pointer, bytes](GpuClient& client) { return client.freeAddresses(pointer, bytes); });
  });
}

kj::Promise<void> ClientSession::memCreate(MemCreateContext context) {
  const std::uint64_t bytes = context.getParams().getBytes();
  return openClientOnDevice(context.getParams().getDevice())
      .then([this, context, bytes](GpuClient* client) mutable {
        if (client != nullptr) noteDeviceUsed(client->deviceIndex());
        // Made on the device, in no context; once the GPU serves, as a context is (a reset under
        // way would take it).
        return answerCreated(
            context, client, CUDA_ERROR_INVALID_DEVICE,
            [bytes](GpuClient& client) {
              return client.whenGpuServes().then(
                  [&client, bytes] { return client.createPhysicalMemory(bytes); });
            },
            [](auto& results, Handle handle) { results.setHandle(handle); });
      });
}

kj::Promise<void> ClientSession::memRelease(MemReleaseContext context) {
  const Handle handle = context.getParams().getHandle();
  return answerFromGpu(
      context, clientFor(handle, HandleKind::kPhysicalMemory), CUDA_ERROR_INVALID_VALUE,
      [handle](GpuClient& client) { return client.releasePhysicalMemory(handle); });
}

kj::Promise<void> ClientSession::memMap(MemMapContext context) {
  auto params = context.getParams();
  const Handle handle = params.getHandle();
  const CUdeviceptr pointer = params.getPointer();
  const std::uint64_t bytes = params.getBytes();
  const std::uint64_t offset = params.getOffset();
  GpuClient* owner = clientFor(handle, HandleKind::kPhysicalMemory);
  return clientReserving(pointer).then(
      [this, context, owner, handle, pointer, bytes, offset](GpuClient* reserving) mutable {
        if (owner != nullptr && reserving != nullptr && owner != reserving) {
          // Memory of one GPU behind addresses reserved on another: through gpuproxy no two devices
          // are peers, so no kernel could reach it where it is mapped.
          spdlog::info(
              "pid {}: mapping memory of device {} into addresses reserved on device {} is not "
              "supported (through gpuproxy no two devices are peers)",
              stats_->identity.pid, owner->deviceIndex(), reserving->deviceIndex());
          context.getResults().setResult(CUDA_ERROR_NOT_SUPPORTED);
          return kj::Promise<void>(kj::READY_NOW);
        }
        return answerFromGpu(context, owner, CUDA_ERROR_INVALID_VALUE,
                             [handle, pointer, bytes, offset](GpuClient& client) {
                               return client.mapMemory(pointer, bytes, offset, handle);
                             });
      });
}

kj::Promise<void> ClientSession::memUnmap(MemUnmapContext context) {
  auto params = context.getParams();
  const CUdeviceptr pointer = params.getPointer();
  const std::uint64_t bytes = params.getBytes();
  return clientReserving(pointer).then([context, pointer, bytes](GpuClient* client) mutable {
    return answerFromGpu(
        context, client, CUDA_ERROR_INVALID_VALUE,
        [pointer, bytes](GpuClient& client) { return client.unmapMemory(pointer, bytes); });
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
  const CUdeviceptr pointer = params.getPointer();
  const std::uint64_t bytes = params.getBytes();
  const bool readWrite = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return clientReserving(pointer).then(
      [context, pointer, bytes, readWrite](GpuClient* client) mutable {
        return answerFromGpu(context, client, CUDA_ERROR_INVALID_VALUE,
                             [pointer, bytes, readWrite](GpuClient& client) {
                               return client.setMemoryAccess(pointer, bytes, readWrite);
                             });
      });
}

}  // namespace gpuproxy::server
