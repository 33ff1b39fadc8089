#include "server/gpu/live_pinned_allocations.hpp"

#include <kj/debug.h>

#include <utility>

namespace gpuproxy::server {

bool LivePinnedAllocations::holds(std::uint64_t offset, std::uint64_t bytes) const {
  const std::lock_guard lock(mutex_);
  // The allocation that starts at or before `offset` must hold the whole range.
  auto after = ranges_.upper_bound(offset);
  if (after == ranges_.begin()) return false;
  const auto& [start, length] = *std::prev(after);
  const std::uint64_t into = offset - start;
  return into < length && bytes <= length - into;
}

bool LivePinnedAllocations::overlaps(std::uint64_t offset, std::uint64_t bytes) const {
  const std::lock_guard lock(mutex_);
  return overlapsAnyRange(ranges_, offset, bytes);
}

void LivePinnedAllocations::add(std::uint64_t offset, std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  KJ_ASSERT(!overlapsAnyRange(ranges_, offset, bytes), "pinned allocations overlap", offset, bytes);
  ranges_.emplace(offset, bytes);
}

std::optional<std::uint64_t> LivePinnedAllocations::remove(std::uint64_t offset) {
  const std::lock_guard lock(mutex_);
  auto found = ranges_.find(offset);
  if (found == ranges_.end()) return std::nullopt;
  const std::uint64_t bytes = found->second;
  ranges_.erase(found);
  return bytes;
}

LivePinnedAllocations::Ranges LivePinnedAllocations::removeAll() {
  const std::lock_guard lock(mutex_);
  return std::exchange(ranges_, {});
}

}  // namespace gpuproxy::server
