#include "server/gpu/ipc_exports.hpp"

#include <kj/debug.h>
#include <sys/random.h>

#include <cerrno>
#include <system_error>

namespace gpuproxy::server {

IpcToken newIpcToken() {
  IpcToken token{};
  std::size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t got = ::getrandom(token.data() + filled, token.size() - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    filled += static_cast<std::size_t>(got);
  }
  return token;
}

CUresult IpcExports::mayOpen(const Party& exporter, const Party& importer) {
  // Another tenant's handle says nothing more than a made-up one.
  if (exporter.tenant != importer.tenant) return CUDA_ERROR_INVALID_VALUE;
  // The driver refuses a process its own handle.
  if (exporter.client == importer.client) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

IpcToken IpcExports::exportMemory(Party exporter, CUdeviceptr base, std::uint64_t bytes) {
  auto found = memory_.find(base);
  if (found != memory_.end()) {
    // Memory kept for importers is not freed, so no other allocation can start at its address:
    // an entry here is this allocation's own export.
    KJ_ASSERT(found->second.exporterHolds && found->second.exporter.client == exporter.client,
              "an export left at the address of a live allocation");
    return found->second.token;
  }
  MemoryExport entry;
  entry.token = newIpcToken();
  entry.bytes = bytes;
  entry.exporter = exporter;
  const IpcToken token = entry.token;
  memory_.emplace(base, std::move(entry));
  memoryTokens_[token] = base;
  return token;
}

backend::Result<IpcExports::Range> IpcExports::openMemory(const IpcToken& token, Party importer) {
  auto named = memoryTokens_.find(token);
  if (named == memoryTokens_.end()) return CUDA_ERROR_INVALID_VALUE;
  MemoryExport& entry = memory_.at(named->second);
  if (CUresult refused = mayOpen(entry.exporter, importer); refused != CUDA_SUCCESS) {
    return refused;
  }
  ++entry.mappings;
  return Range{named->second, entry.bytes};
}

std::optional<MemoryCharge> IpcExports::closeMemory(CUdeviceptr base) {
  auto found = memory_.find(base);
  if (found == memory_.end() || found->second.mappings == 0) return std::nullopt;
  if (--found->second.mappings > 0 || found->second.exporterHolds) return std::nullopt;
  std::optional<MemoryCharge> charge = std::move(found->second.keptCharge);
  memory_.erase(found);
  return charge;
}

bool IpcExports::keepForImporters(CUdeviceptr base, MemoryCharge& charge) {
  auto found = memory_.find(base);
  if (found == memory_.end() || !found->second.exporterHolds) return false;
  memoryTokens_.erase(found->second.token);
  if (found->second.mappings == 0) {
    memory_.erase(found);
    return false;
  }
  found->second.exporterHolds = false;
  found->second.keptCharge.emplace(std::move(charge));
  return true;
}

std::size_t IpcExports::memoryKeptForImporters() const {
  std::size_t kept = 0;
  for (const auto& [base, entry] : memory_) kept += entry.exporterHolds ? 0 : 1;
  return kept;
}

std::uint64_t IpcExports::bytesKeptForImporters() const {
  std::uint64_t bytes = 0;
  for (const auto& [base, entry] : memory_) {
    if (entry.keptCharge) bytes += entry.keptCharge->bytes();
  }
  return bytes;
}

IpcToken IpcExports::exportEvent(Party exporter, const std::shared_ptr<backend::Event>& event) {
  // Exports whose event no client holds any more are dropped first: a new event may have the
  // address of one of them.
  for (auto it = events_.begin(); it != events_.end();) {
    if (it->second.event.expired()) {
      std::erase_if(eventTokens_, [&](const auto& known) { return known.second == it->first; });
      it = events_.erase(it);
    } else {
      ++it;
    }
  }
  if (auto known = eventTokens_.find(event.get()); known != eventTokens_.end()) {
    return known->second;
  }
  const IpcToken token = newIpcToken();
  events_[token] = EventExport{exporter, event};
  eventTokens_[event.get()] = token;
  return token;
}

backend::Result<std::shared_ptr<backend::Event>> IpcExports::openEvent(const IpcToken& token,
                                                                       Party importer) {
  auto named = events_.find(token);
  if (named == events_.end()) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult refused = mayOpen(named->second.exporter, importer); refused != CUDA_SUCCESS) {
    return refused;
  }
  std::shared_ptr<backend::Event> event = named->second.event.lock();
  if (!event) return CUDA_ERROR_INVALID_VALUE;  // dropped at the next export
  return event;
}

void IpcExports::forgetEvent(const backend::Event& event) {
  auto known = eventTokens_.find(&event);
  if (known == eventTokens_.end()) return;
  events_.erase(known->second);
  eventTokens_.erase(known);
}

}  // namespace gpuproxy::server
