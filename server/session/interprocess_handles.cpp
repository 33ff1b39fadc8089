// Interprocess handles (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle,
// cuIpcGetEventHandle, cuIpcOpenEventHandle, and physical memory's shareable handles,
// cuMemExportToShareableHandle, cuMemImportFromShareableHandle): the session's routing. What a
// token names, and who may open it, is the GPU's table (server/gpu/ipc_exports.hpp); the mappings
// and events each client holds are its GpuClient's.

#include "server/session/client_session.hpp"

#include "server/session/call_answers.hpp"

#include <cstring>

namespace gpuproxy::server {

namespace {

capnp::Data::Reader dataOf(const IpcToken& token) {
  return {reinterpret_cast<const capnp::byte*>(token.data()), token.size()};
}

// Puts a token made on daemon device `device` into the answer of the call that exported it.
auto storeToken(std::uint32_t device) {
  return [device](auto& results, const IpcToken& token) {
    results.setDevice(device);
    results.setToken(dataOf(token));
  };
}

IpcToken tokenOf(capnp::Data::Reader data) {
  IpcToken token{};
  std::memcpy(token.data(), data.begin(), token.size());  // sized by clientForIpcOpen
  return token;
}

}  // namespace

GpuClient* ClientSession::clientForIpcOpen(std::uint64_t context, std::uint32_t device,
                                           capnp::Data::Reader token, CUresult& refused) {
  GpuClient* client = clientFor(context, HandleKind::kContext);
  if (client == nullptr) {
    refused = CUDA_ERROR_INVALID_CONTEXT;
    return nullptr;
  }
  if (token.size() != sizeof(IpcToken) || device >= services_.gpus.size()) {
    refused = CUDA_ERROR_INVALID_VALUE;
    return nullptr;
  }
  if (device != client->deviceIndex()) {
    // The memory or event lives on another GPU, which would have to be a peer of this one.
    refused = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    return nullptr;
  }
  return client;
}

kj::Promise<void> ClientSession::ipcExportMemory(IpcExportMemoryContext context) {
  const CUdeviceptr pointer = context.getParams().getPointer();
  return firstClientWhere([pointer](GpuClient& client) { return client.inAllocation(pointer); })
      .then([context, pointer](GpuClient* client) mutable {
        const std::uint32_t device = client == nullptr ? 0 : client->deviceIndex();
        return answerCreated(
            context, client, CUDA_ERROR_INVALID_VALUE,
            [pointer](GpuClient& exporter) { return exporter.exportMemory(pointer); },
            storeToken(device));
      });
}

kj::Promise<void> ClientSession::ipcOpenMemory(IpcOpenMemoryContext context) {
  auto params = context.getParams();
  CUresult refused = CUDA_SUCCESS;
  GpuClient* client =
      clientForIpcOpen(params.getContext(), params.getDevice(), params.getToken(), refused);
  if (client == nullptr) {
    context.getResults().setResult(refused);
    return kj::READY_NOW;
  }
  return answerCreated(
      context, client, refused,
      [handle = params.getContext(), token = tokenOf(params.getToken())](GpuClient& opener) {
        return opener.openMemory(handle, token);
      },
      [](auto& results, const IpcExports::Range& range) {
        results.setPointer(range.base);
        results.setBytes(range.bytes);
      });
}

kj::Promise<void> ClientSession::ipcCloseMemory(IpcCloseMemoryContext context) {
  const CUdeviceptr pointer = context.getParams().getPointer();
  return firstClientWhere([pointer](GpuClient& client) { return client.holdsMapping(pointer); })
      .then([context, pointer](GpuClient* holder) mutable {
        return answerFromGpu(context, holder, CUDA_ERROR_INVALID_VALUE,
                             [pointer](GpuClient& client) { return client.closeMemory(pointer); });
      });
}

kj::Promise<void> ClientSession::ipcExportEvent(IpcExportEventContext context) {
  const std::uint64_t event = context.getParams().getEvent();
  GpuClient* client = clientFor(event, HandleKind::kEvent);
  const std::uint32_t device = client == nullptr ? 0 : client->deviceIndex();
  return answerCreated(
      context, client, CUDA_ERROR_INVALID_HANDLE,
      [event](GpuClient& exporter) { return exporter.exportEvent(event); }, storeToken(device));
}

kj::Promise<void> ClientSession::ipcOpenEvent(IpcOpenEventContext context) {
  auto params = context.getParams();
  CUresult refused = CUDA_SUCCESS;
  GpuClient* client =
      clientForIpcOpen(params.getContext(), params.getDevice(), params.getToken(), refused);
  if (client == nullptr) {
    context.getResults().setResult(refused);
    return kj::READY_NOW;
  }
  return answerCreated(
      context, client, refused,
      [handle = params.getContext(), token = tokenOf(params.getToken())](GpuClient& opener) {
        return opener.openEvent(handle, token);
      },
      [](auto& results, Handle event) { results.setEvent(event); });
}

kj::Promise<void> ClientSession::memExport(MemExportContext context) {
  const Handle handle = context.getParams().getHandle();
  GpuClient* client = clientFor(handle, HandleKind::kPhysicalMemory);
  const std::uint32_t device = client == nullptr ? 0 : client->deviceIndex();
  return answerCreated(
      context, client, CUDA_ERROR_INVALID_VALUE,
      [handle](GpuClient& exporter) { return exporter.exportPhysicalMemory(handle); },
      storeToken(device));
}

kj::Promise<void> ClientSession::memImport(MemImportContext context) {
  auto params = context.getParams();
  if (params.getToken().size() != sizeof(IpcToken)) {
    context.getResults().setResult(CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  const std::optional<std::uint32_t> ordinal = ordinalOf(params.getDevice());
  if (!ordinal) {
    context.getResults().setResult(CUDA_ERROR_INVALID_DEVICE);
    return kj::READY_NOW;
  }
  const IpcToken token = tokenOf(params.getToken());
  return openClientOnDevice(*ordinal).then(
      [this, context, ordinal = *ordinal, token](GpuClient* client) mutable {
        if (client != nullptr) noteDeviceUsed(client->deviceIndex());
        // Physical memory the client holds, as memCreate's: once the GPU serves.
        return answerCreated(
            context, client, CUDA_ERROR_INVALID_DEVICE,
            [token](GpuClient& importer) {
              return importer.whenGpuServes().then(
                  [&importer, token] { return importer.importPhysicalMemory(token); });
            },
            [ordinal](auto& results, const GpuClient::ImportedMemory& imported) {
              results.setHandle(imported.handle);
              results.setBytes(imported.bytes);
              results.setOrdinal(ordinal);
            });
      });
}

}  // namespace gpuproxy::server
