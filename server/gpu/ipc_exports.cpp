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

template <typename Object>
IpcToken IpcExports::SharedExports<Object>::add(Party exporter,
                                                const std::shared_ptr<Object>& object) {
  // Exports whose object no client holds any more are dropped first: a new object may have the
  // address of one of them.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.object.expired()) {
      std::erase_if(tokens_, [&](const auto& known) { return known.second == it->first; });
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  if (auto known = tokens_.find(object.get()); known != tokens_.end()) return known->second;
  const IpcToken token = newIpcToken();
  entries_[token] = Entry{exporter, object};
  tokens_[object.get()] = token;
  return token;
}

template <typename Object>
backend::Result<std::shared_ptr<Object>> IpcExports::SharedExports<Object>::open(
    const IpcToken& token, Party importer, bool exporterOpens) const {
  auto named = entries_.find(token);
  if (named == entries_.end()) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult refused = mayOpen(named->second.exporter, importer);
      refused != CUDA_SUCCESS && !(exporterOpens && refused == CUDA_ERROR_INVALID_CONTEXT)) {
    return refused;
  }
  std::shared_ptr<Object> object = named->second.object.lock();
  if (!object) return CUDA_ERROR_INVALID_VALUE;  // dropped at the next export
  return object;
}

template <typename Object>
void IpcExports::SharedExports<Object>::forget(const Object& object) {
  auto known = tokens_.find(&object);
  if (known == tokens_.end()) return;
  entries_.erase(known->second);
  tokens_.erase(known);
}

IpcToken IpcExports::exportEvent(Party exporter, const std::shared_ptr<backend::Event>& event) {
  return events_.add(exporter, event);
}

backend::Result<std::shared_ptr<backend::Event>> IpcExports::openEvent(const IpcToken& token,
                                                                       Party importer) {
  return events_.open(token, importer, /*exporterOpens=*/false);
}

void IpcExports::forgetEvent(const backend::Event& event) {
  events_.forget(event);
}

IpcToken IpcExports::exportPhysical(Party exporter, const std::shared_ptr<PhysicalMemory>& memory) {
  return physical_.add(exporter, memory);
}

backend::Result<std::shared_ptr<PhysicalMemory>> IpcExports::openPhysical(const IpcToken& token,
                                                                          Party importer) {
  return physical_.open(token, importer, /*exporterOpens=*/true);
}

}  // namespace gpuproxy::server
