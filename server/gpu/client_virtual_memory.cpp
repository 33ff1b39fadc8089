#include "server/gpu/client_virtual_memory.hpp"

#include "protocol/limits.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <spdlog/spdlog.h>

#include <iterator>

namespace gpuproxy::server {
namespace {

constexpr std::uint64_t kGranule = protocol::kVirtualMemoryGranularity;
constexpr std::uint64_t kHostPage = 4096;

bool isGranular(std::uint64_t value) {
  return value % kGranule == 0;
}

}  // namespace

ClientVirtualMemory::~ClientVirtualMemory() {
  for (auto it = mappings_.begin(); it != mappings_.end();) unmapOne(it++);
  for (auto it = physical_.begin(); it != physical_.end();) {
    const auto next = std::next(it);
    it->second.released = true;
    giveBackIfUnused(it);
    it = next;
  }
  for (const auto& [start, reservation] : reservations_) {
    shard_.device().freeAddresses(start, reservation.bytes);
  }
}

bool ClientVirtualMemory::holdsAny() const {
  return !reservations_.empty() || !physical_.empty() || !mappings_.empty();
}

bool ClientVirtualMemory::hasRoom() const {
  return reservations_.size() + physical_.size() + mappings_.size() <
         protocol::kMaxVirtualMemoryObjects;
}

backend::Result<CUdeviceptr> ClientVirtualMemory::reserve(std::uint64_t bytes,
                                                          std::uint64_t alignment) {
  if (bytes == 0 || bytes % kHostPage != 0 || (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!hasRoom()) return CUDA_ERROR_OUT_OF_MEMORY;
  auto reserved = shard_.device().reserveAddresses(bytes, alignment);
  if (!reserved.ok()) return reserved;
  reservations_.emplace(reserved.value(), Reservation{bytes});
  return reserved;
}

CUresult ClientVirtualMemory::freeReservation(CUdeviceptr start, std::uint64_t bytes) {
  const auto found = reservations_.find(start);
  if (found == reservations_.end() || found->second.bytes != bytes) return CUDA_ERROR_INVALID_VALUE;
  const auto mapped = mappings_.lower_bound(start);
  if (mapped != mappings_.end() && mapped->first - start < bytes) return CUDA_ERROR_INVALID_VALUE;
  reservations_.erase(found);
  return shard_.device().freeAddresses(start, bytes);
}

bool ClientVirtualMemory::reserves(CUdeviceptr address) const {
  auto after = reservations_.upper_bound(address);
  if (after == reservations_.begin()) return false;
  const auto& [start, reservation] = *std::prev(after);
  return address - start < reservation.bytes;
}

void ClientVirtualMemory::addPhysical(Handle handle, std::shared_ptr<PhysicalMemory> memory) {
  physical_.emplace(handle, Physical{std::move(memory)});
}

std::shared_ptr<PhysicalMemory> ClientVirtualMemory::physical(Handle handle) const {
  const auto found = physical_.find(handle);
  if (found == physical_.end() || found->second.released) return nullptr;
  return found->second.memory;
}

CUresult ClientVirtualMemory::release(Handle handle) {
  const auto found = physical_.find(handle);
  if (found == physical_.end() || found->second.released) return CUDA_ERROR_INVALID_VALUE;
  found->second.released = true;
  giveBackIfUnused(found);
  return CUDA_SUCCESS;
}

void ClientVirtualMemory::giveBackIfUnused(std::map<Handle, Physical>::iterator physical) {
  if (!physical->second.released || physical->second.mappings > 0) return;
  physical_.erase(physical);  // and the memory with it, if this was its last holder
}

CUresult ClientVirtualMemory::map(CUdeviceptr address, std::uint64_t bytes, std::uint64_t offset,
                                  Handle handle) {
  const auto physical = physical_.find(handle);
  if (physical == physical_.end() || physical->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0 || !isGranular(address) || !isGranular(bytes) || !isGranular(offset)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t size = physical->second.memory->bytes();
  if (offset >= size || bytes > size - offset) return CUDA_ERROR_INVALID_VALUE;
  // Inside one reservation...
  auto reservation = reservations_.upper_bound(address);
  if (reservation == reservations_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --reservation;
  const std::uint64_t into = address - reservation->first;
  if (into >= reservation->second.bytes || bytes > reservation->second.bytes - into) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // ...over nothing mapped.
  const auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first - address < bytes) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    const auto& [start, before] = *std::prev(next);
    if (address - start < before.bytes) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!hasRoom()) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult mapped =
      shard_.device().mapMemory(address, bytes, physical->second.memory->backendHandle(), offset);
  if (mapped != CUDA_SUCCESS) return mapped;
  mappings_.emplace(address, Mapping{bytes, handle, false});
  ++physical->second.mappings;
  return CUDA_SUCCESS;
}

std::vector<ClientVirtualMemory::Mappings::iterator> ClientVirtualMemory::mappingsMakingUp(
    CUdeviceptr address, std::uint64_t bytes) {
  std::vector<Mappings::iterator> found;
  std::uint64_t covered = 0;
  for (auto it = mappings_.find(address); it != mappings_.end() && it->first == address + covered;
       ++it) {
    found.push_back(it);
    covered += it->second.bytes;
    if (covered >= bytes) break;
  }
  if (covered != bytes) found.clear();
  return found;
}

void ClientVirtualMemory::unmapOne(Mappings::iterator mapping) {
  const CUresult unmapped = shard_.device().unmapMemory(mapping->first, mapping->second.bytes);
  if (unmapped != CUDA_SUCCESS && !isStickyError(unmapped)) {
    spdlog::error("device {}: unmapping {:#x} of pid {} failed ({})", shard_.index(),
                  mapping->first, pid_, static_cast<int>(unmapped));
  }
  const auto physical = physical_.find(mapping->second.physical);
  mappings_.erase(mapping);
  if (physical == physical_.end()) return;
  --physical->second.mappings;
  giveBackIfUnused(physical);
}

CUresult ClientVirtualMemory::unmap(CUdeviceptr address, std::uint64_t bytes) {
  const auto found = mappingsMakingUp(address, bytes);
  if (found.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& mapping : found) unmapOne(mapping);
  return CUDA_SUCCESS;
}

CUresult ClientVirtualMemory::setAccess(CUdeviceptr address, std::uint64_t bytes, bool writable) {
  const auto found = mappingsMakingUp(address, bytes);
  if (found.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Mapping by mapping, as unmapOne unmaps: the device is told of whole mappings only.
  for (const auto& mapping : found) {
    const CUresult set =
        shard_.device().setMemoryAccess(mapping->first, mapping->second.bytes, owner_, writable);
    if (set != CUDA_SUCCESS) return set;
    mapping->second.writable = writable;
  }
  return CUDA_SUCCESS;
}

bool ClientVirtualMemory::reaches(CUdeviceptr pointer, std::uint64_t bytes) const {
  auto after = mappings_.upper_bound(pointer);
  if (after == mappings_.begin()) return false;
  const auto& [start, mapping] = *std::prev(after);
  const std::uint64_t into = pointer - start;
  return mapping.writable && into < mapping.bytes && bytes <= mapping.bytes - into;
}

}  // namespace gpuproxy::server
