// Module images that arrive in pieces (Session.beginModuleImage / appendModuleImage /
// loadModuleImage): no message is larger than a transfer chunk, and the daemon never holds image
// bytes it has not charged to the tenant.
#include "server/session/client_session.hpp"

#include "server/gpu/gpu_messages.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace gpuproxy::server {

kj::Promise<void> ClientSession::beginModuleImage(BeginModuleImageContext context) {
  auto params = context.getParams();
  const std::uint64_t bytes = params.getBytes();
  const std::uint64_t moduleContext = params.getContext();
  GpuClient* client = clientFor(moduleContext, HandleKind::kContext);
  if (client == nullptr) {
    context.getResults().setResult(CUDA_ERROR_INVALID_CONTEXT);
    return kj::READY_NOW;
  }
  if (bytes == 0) {
    context.getResults().setResult(CUDA_ERROR_INVALID_IMAGE);
    return kj::READY_NOW;
  }
  const std::uint32_t device = client->deviceIndex();
  // No image is larger than the device: the module it makes would not fit.
  return onGpu(*client,
               [moduleContext](GpuClient& client) { return client.memoryInfo(moduleContext); })
      .then([this, context, bytes, moduleContext,
             device](backend::Result<backend::MemoryInfo> memory) mutable {
        auto results = context.getResults();
        results.setResult(beginUpload(memory, moduleContext, device, bytes, results));
      });
}

CUresult ClientSession::beginUpload(const backend::Result<backend::MemoryInfo>& memory,
                                    std::uint64_t moduleContext, std::uint32_t device,
                                    std::uint64_t bytes,
                                    protocol::Session::BeginModuleImageResults::Builder results) {
  if (!memory.ok()) return memory.code();
  if (bytes > memory.value().total) return CUDA_ERROR_OUT_OF_MEMORY;
  if (uploads_.size() >= kMaxModuleUploads) {
    spdlog::info("pid {}: refused a module upload: {} are open already", stats_->identity.pid,
                 uploads_.size());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto charge = TenantMemoryHold::take(stats_->tenant, device, bytes);
  if (!charge) {
    spdlog::info(
        "device {}: pid {} of tenant '{}' announced a module image of {} bytes beyond "
        "its limit",
        device, stats_->identity.pid, stats_->tenant->name(), bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const std::uint64_t id = ++lastUpload_;
  uploads_.emplace(id, std::make_unique<ModuleUpload>(
                           ModuleUpload{moduleContext, bytes, {}, std::move(*charge)}));
  results.setUpload(id);
  return CUDA_SUCCESS;
}

kj::Promise<void> ClientSession::appendModuleImage(AppendModuleImageContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  auto found = uploads_.find(params.getUpload());
  if (found == uploads_.end()) {
    results.setResult(CUDA_ERROR_INVALID_HANDLE);
    return kj::READY_NOW;
  }
  ModuleUpload& upload = *found->second;
  std::span<const std::byte> piece;
  const capnp::Data::Reader inMessage = params.getPiece();
  if (inMessage.size() > 0) {
    piece = {reinterpret_cast<const std::byte*>(inMessage.begin()), inMessage.size()};
  } else if (segment_) {
    // The staging region of the client's segment: checked against its bounds here, since no
    // decoder has looked at these numbers.
    const std::uint64_t offset = params.getStagingOffset();
    const std::uint64_t bytes = params.getStagingBytes();
    const std::uint64_t region = segment_->limits().stagingBytes;
    if (offset > region || bytes > region - offset) {
      uploads_.erase(found);
      results.setResult(CUDA_ERROR_INVALID_VALUE);
      return kj::READY_NOW;
    }
    piece = segment_->hostBytes({protocol::ring::HostRegion::kStaging, offset}, bytes);
  }
  if (piece.size() > protocol::MAX_TRANSFER_CHUNK ||
      piece.size() > upload.announced - upload.image.size()) {
    uploads_.erase(found);
    results.setResult(CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  // The whole image is charged already; the buffer grows only as pieces arrive.
  upload.image.insert(upload.image.end(), piece.begin(), piece.end());
  results.setResult(CUDA_SUCCESS);
  return kj::READY_NOW;
}

kj::Promise<void> ClientSession::loadModuleImage(LoadModuleImageContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  auto found = uploads_.find(params.getUpload());
  if (found == uploads_.end()) {
    results.setResult(CUDA_ERROR_INVALID_HANDLE);
    return kj::READY_NOW;
  }
  // The upload ends here, whatever the answer; its charge goes with it once the module has
  // charged its own memory.
  std::unique_ptr<ModuleUpload> upload = std::move(found->second);
  uploads_.erase(found);
  if (upload->image.size() != upload->announced) {
    results.setResult(CUDA_ERROR_INVALID_IMAGE);
    return kj::READY_NOW;
  }
  GpuClient* client = clientFor(upload->context, HandleKind::kContext);
  if (client == nullptr) {
    results.setResult(CUDA_ERROR_INVALID_CONTEXT);
    return kj::READY_NOW;
  }
  // Loading charges the module's own memory, so the image's charge is released first: an image
  // the limit just allowed must not be refused for being counted twice.
  const std::uint64_t moduleContext = upload->context;
  std::vector<std::byte> image = std::move(upload->image);
  upload.reset();
  return answerLoadedModule(context, *client, moduleContext, std::move(image));
}

}  // namespace gpuproxy::server
