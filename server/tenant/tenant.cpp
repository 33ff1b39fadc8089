#include "server/tenant/tenant.hpp"

#include <algorithm>

namespace gpuproxy::server {

TenantLimits Tenant::limits() const {
  std::lock_guard lock(mutex_);
  return definition_.limits;
}

Tenant::SchedulingTerms Tenant::schedulingTerms() const {
  std::lock_guard lock(mutex_);
  return SchedulingTerms{definition_.limits.weight, definition_.limits.tenantClass};
}

void Tenant::setLimits(TenantLimits limits) {
  std::lock_guard lock(mutex_);
  definition_.limits = std::move(limits);
}

bool Tenant::mayUseDevice(std::uint32_t device) const {
  std::lock_guard lock(mutex_);
  const auto& devices = definition_.limits.devices;
  return !devices || std::find(devices->begin(), devices->end(), device) != devices->end();
}

std::string_view tenantObjectName(TenantObject kind) {
  switch (kind) {
    case TenantObject::kContext:
      return "contexts";
    case TenantObject::kStream:
      return "streams";
    case TenantObject::kEvent:
      return "events";
    case TenantObject::kModule:
      return "modules";
  }
  return "objects";
}

std::uint32_t Tenant::objectLimit(TenantObject kind) const {
  std::lock_guard lock(mutex_);
  return objectLimitLocked(kind);
}

std::uint32_t Tenant::objectsHeld(TenantObject kind) const {
  std::lock_guard lock(mutex_);
  return objectsHeld_[static_cast<std::size_t>(kind)];
}

std::uint32_t Tenant::objectLimitLocked(TenantObject kind) const {
  const auto index = static_cast<std::size_t>(kind);
  return definition_.limits.maxObjects[index].value_or(kDefaultMaxObjects[index]);
}

bool Tenant::tryTakeObject(TenantObject kind) {
  std::lock_guard lock(mutex_);
  std::uint32_t& held = objectsHeld_[static_cast<std::size_t>(kind)];
  if (held >= objectLimitLocked(kind)) return false;
  ++held;
  return true;
}

void Tenant::giveBackObject(TenantObject kind) {
  std::lock_guard lock(mutex_);
  std::uint32_t& held = objectsHeld_[static_cast<std::size_t>(kind)];
  if (held > 0) --held;
}

bool Tenant::tryCharge(std::uint32_t device, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  std::uint64_t& used = memoryUsed_[device];
  const auto& limit = definition_.limits.memoryLimit;
  // Written to avoid overflow: a client controls `bytes`.
  if (limit && (used > *limit || bytes > *limit - used)) {
    ++oomCount;
    return false;
  }
  used += bytes;
  return true;
}

void Tenant::credit(std::uint32_t device, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  std::uint64_t& used = memoryUsed_[device];
  used = bytes > used ? 0 : used - bytes;
}

bool Tenant::tryChargePinned(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const auto& limit = definition_.limits.pinnedMemoryLimit;
  if (limit && (pinnedMemoryUsed_ > *limit || bytes > *limit - pinnedMemoryUsed_)) {
    ++oomCount;
    return false;
  }
  pinnedMemoryUsed_ += bytes;
  return true;
}

std::uint64_t Tenant::pinnedMemoryUsed() const {
  std::lock_guard lock(mutex_);
  return pinnedMemoryUsed_;
}

void Tenant::creditPinned(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  pinnedMemoryUsed_ = bytes > pinnedMemoryUsed_ ? 0 : pinnedMemoryUsed_ - bytes;
}

std::uint64_t Tenant::memoryUsed(std::uint32_t device) const {
  std::lock_guard lock(mutex_);
  auto found = memoryUsed_.find(device);
  return found == memoryUsed_.end() ? 0 : found->second;
}

std::uint64_t Tenant::memoryUsed() const {
  std::lock_guard lock(mutex_);
  std::uint64_t total = 0;
  for (const auto& [device, used] : memoryUsed_) total += used;
  return total;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> Tenant::memoryInfo(
    std::uint32_t device, std::uint64_t deviceFree) const {
  std::lock_guard lock(mutex_);
  const auto& limit = definition_.limits.memoryLimit;
  if (!limit) return std::nullopt;
  auto found = memoryUsed_.find(device);
  const std::uint64_t used = found == memoryUsed_.end() ? 0 : found->second;
  std::uint64_t headroom = used >= *limit ? 0 : *limit - used;
  return std::make_pair(std::min(headroom, deviceFree), *limit);
}

void Tenant::addGpuTime(std::int64_t now, std::uint64_t nanoseconds) {
  std::lock_guard lock(mutex_);
  gpuTimeWindow_.add(now, nanoseconds);
}

std::uint64_t Tenant::recentGpuTime(std::int64_t now) const {
  std::lock_guard lock(mutex_);
  return gpuTimeWindow_.total(now);
}

}  // namespace gpuproxy::server
