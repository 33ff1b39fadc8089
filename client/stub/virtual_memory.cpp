#include "client/stub/virtual_memory.hpp"

#include <iterator>

namespace gpuproxy::stub {

void VirtualMemoryTable::addReservation(CUdeviceptr start, std::uint64_t bytes,
                                        std::uint64_t context) {
  std::lock_guard lock(mutex_);
  reservations_[start] = Reservation{bytes, context};
}

void VirtualMemoryTable::forgetReservation(CUdeviceptr start) {
  std::lock_guard lock(mutex_);
  reservations_.erase(start);
}

std::optional<std::uint64_t> VirtualMemoryTable::reservationContext(CUdeviceptr address) const {
  std::lock_guard lock(mutex_);
  auto after = reservations_.upper_bound(address);
  if (after == reservations_.begin()) return std::nullopt;
  const auto& [start, reservation] = *std::prev(after);
  if (address - start >= reservation.bytes) return std::nullopt;
  return reservation.context;
}

void VirtualMemoryTable::addPhysical(std::uint64_t handle, Physical physical) {
  std::lock_guard lock(mutex_);
  physical_[handle] = physical;
}

std::optional<VirtualMemoryTable::Physical> VirtualMemoryTable::physical(
    std::uint64_t handle) const {
  std::lock_guard lock(mutex_);
  auto found = physical_.find(handle);
  if (found == physical_.end()) return std::nullopt;
  return found->second;
}

bool VirtualMemoryTable::retain(std::uint64_t handle) {
  std::lock_guard lock(mutex_);
  auto found = physical_.find(handle);
  if (found == physical_.end()) return false;
  ++found->second.references;
  return true;
}

std::optional<bool> VirtualMemoryTable::release(std::uint64_t handle) {
  std::lock_guard lock(mutex_);
  auto found = physical_.find(handle);
  if (found == physical_.end()) return std::nullopt;
  if (--found->second.references > 0) return false;
  physical_.erase(found);
  return true;
}

void VirtualMemoryTable::addMapping(CUdeviceptr start, Mapping mapping) {
  std::lock_guard lock(mutex_);
  mappings_[start] = mapping;
}

std::vector<std::pair<CUdeviceptr, VirtualMemoryTable::Mapping>> VirtualMemoryTable::mappingsIn(
    CUdeviceptr start, std::uint64_t bytes) const {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<CUdeviceptr, Mapping>> found;
  for (auto it = mappings_.lower_bound(start); it != mappings_.end() && it->first - start < bytes;
       ++it) {
    found.emplace_back(*it);
  }
  return found;
}

void VirtualMemoryTable::forgetMappingsIn(CUdeviceptr start, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  for (auto it = mappings_.lower_bound(start);
       it != mappings_.end() && it->first - start < bytes;) {
    it = mappings_.erase(it);
  }
}

void VirtualMemoryTable::setAccess(CUdeviceptr start, std::uint64_t bytes,
                                   CUmemAccess_flags access) {
  std::lock_guard lock(mutex_);
  for (auto it = mappings_.lower_bound(start); it != mappings_.end() && it->first - start < bytes;
       ++it) {
    it->second.access = access;
  }
}

std::optional<std::pair<CUdeviceptr, VirtualMemoryTable::Mapping>> VirtualMemoryTable::mappingAt(
    CUdeviceptr address) const {
  std::lock_guard lock(mutex_);
  auto after = mappings_.upper_bound(address);
  if (after == mappings_.begin()) return std::nullopt;
  const auto& [start, mapping] = *std::prev(after);
  if (address - start >= mapping.bytes) return std::nullopt;
  return std::make_pair(start, mapping);
}

}  // namespace gpuproxy::stub
