#include "server/session/connection_registry.hpp"

namespace gpuproxy::server {

ConnectionRegistry::Registration ConnectionRegistry::add(pid_t pid, TenantId tenant) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  std::uint64_t id = nextId_++;
  entries_.emplace(id, Entry{pid, tenant, kj::mv(paf.fulfiller)});
  return Registration{id, kj::mv(paf.promise)};
}

void ConnectionRegistry::forget(std::uint64_t id) {
  entries_.erase(id);
}

std::uint32_t ConnectionRegistry::end(pid_t pid) {
  std::uint32_t ended = 0;
  for (auto& [id, entry] : entries_) {
    if (entry.pid != pid) continue;
    entry.ender->fulfill();
    ++ended;
  }
  return ended;
}

std::uint32_t ConnectionRegistry::endTenant(TenantId tenant) {
  std::uint32_t ended = 0;
  for (auto& [id, entry] : entries_) {
    if (entry.tenant != tenant || !entry.ender->isWaiting()) continue;
    entry.ender->fulfill();
    ++ended;
  }
  return ended;
}

void ConnectionRegistry::endConnection(std::uint64_t id) {
  auto found = entries_.find(id);
  if (found != entries_.end()) found->second.ender->fulfill();
}

}  // namespace gpuproxy::server
