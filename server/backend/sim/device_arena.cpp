#include "server/backend/sim/device_arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

namespace gpuproxy::server::sim {
namespace {

std::uint64_t pageSize() {
  static const std::uint64_t kPageSize = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return kPageSize;
}

}  // namespace

std::unique_ptr<DeviceArena> DeviceArena::create(CUdeviceptr base, std::uint64_t capacity,
                                                 void* hostHint, AddressWindow reservable) {
  if (capacity == 0 || capacity % kAllocationAlignment != 0) return nullptr;
  if (reservable.begin < reservable.end && reservable.begin < base + capacity &&
      base < reservable.end) {
    return nullptr;
  }
  // MAP_NORESERVE: a 16 GiB device costs address space only; pages are backed when first written.
  void* host = mmap(hostHint, capacity, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (host == MAP_FAILED) return nullptr;
  return std::unique_ptr<DeviceArena>(
      new DeviceArena(base, static_cast<std::byte*>(host), capacity, reservable));
}

DeviceArena::DeviceArena(CUdeviceptr base, std::byte* host, std::uint64_t capacity,
                         AddressWindow reservable)
    : base_(base), host_(host), capacity_(capacity), window_(reservable) {
  insertFreeLocked(0, capacity_);
  dropper_ = std::thread([this] { dropperMain(); });
}

DeviceArena::~DeviceArena() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  retiredWork_.notify_all();
  dropper_.join();
  munmap(host_, capacity_);
}

void DeviceArena::dropperMain() {
  std::unique_lock lock(mutex_);
  for (;;) {
    retiredWork_.wait(lock, [&] { return stopping_ || !retired_.empty(); });
    if (stopping_) return;
    const auto [offset, reserved] = retired_.front();
    retired_.pop_front();
    ++dropping_;
    lock.unlock();
    // Nobody can reach the pages wholly inside the range: it is neither live nor free.
    const std::uint64_t page = pageSize();
    const std::uint64_t begin = (offset + page - 1) / page * page;
    const std::uint64_t end = (offset + reserved) / page * page;
    if (begin < end) madvise(host_ + begin, end - begin, MADV_DONTNEED);
    lock.lock();
    --dropping_;
    releaseRangeLocked(offset, reserved);
    released_.notify_all();
  }
}

void DeviceArena::retireLocked(std::uint64_t offset, std::uint64_t reserved) {
  retired_.emplace_back(offset, reserved);
  retiredWork_.notify_one();
}

bool DeviceArena::releasePendingLocked() const {
  return !quarantined_.empty() || !retired_.empty() || dropping_ > 0;
}

void DeviceArena::changedLocked(backend::AddressSpace owner) {
  Holdings& holdings = holdings_[owner];
  holdings.version = nextVersion_++;
  // Versions are never reused, so an owner that holds nothing can be forgotten.
  if (holdings.allocations.empty() && holdings.hostRanges.empty() && holdings.mappings.empty()) {
    holdings_.erase(owner);
  }
}

std::uint64_t DeviceArena::generation() const {
  std::lock_guard lock(mutex_);
  return generation_;
}

backend::Result<CUdeviceptr> DeviceArena::allocate(std::size_t bytes, backend::AddressSpace owner,
                                                   std::uint64_t readOnlyFrom) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > capacity_) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uint64_t reserved = reservedBytes(bytes);
  std::unique_lock lock(mutex_);
  auto fit = freeBySize_.lower_bound({reserved, 0});
  // What was freed but is not back yet (the engine is still working, or its pages are being given
  // back) is free all the same: wait for it rather than fail.
  while (fit == freeBySize_.end() && releasePendingLocked()) {
    released_.wait(lock);
    fit = freeBySize_.lower_bound({reserved, 0});
  }
  if (fit == freeBySize_.end()) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto [size, offset] = *fit;
  eraseFreeLocked(freeByOffset_.find(offset));
  if (size > reserved) insertFreeLocked(offset + reserved, size - reserved);
  live_.emplace(offset, Allocation{bytes, reserved, owner, readOnlyFrom, {}});
  holdings_[owner].allocations.insert(offset);
  changedLocked(owner);
  allocated_ += reserved;
  return base_ + offset;
}

CUresult DeviceArena::free(CUdeviceptr pointer) {
  if (pointer < base_ || pointer - base_ >= capacity_) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t offset = pointer - base_;
  std::lock_guard lock(mutex_);
  const auto found = live_.find(offset);
  if (found == live_.end() || found->second.mappings > 0) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t reserved = found->second.reserved;
  const backend::AddressSpace owner = found->second.owner;
  for (const backend::AddressSpace with : found->second.sharedWith) {
    holdings_[with].allocations.erase(offset);
    changedLocked(with);
  }
  live_.erase(found);
  holdings_[owner].allocations.erase(offset);
  changedLocked(owner);
  allocated_ -= reserved;
  if (accesses_ > 0) {
    quarantined_.emplace_back(offset, reserved);
  } else {
    retireLocked(offset, reserved);
  }
  return CUDA_SUCCESS;
}

void DeviceArena::releaseRangeLocked(std::uint64_t offset, std::uint64_t reserved) {
  // Coalesce with the free neighbours on both sides.
  std::uint64_t begin = offset;
  std::uint64_t end = offset + reserved;
  auto next = freeByOffset_.lower_bound(offset);
  if (next != freeByOffset_.end() && next->first == end) {
    end += next->second;
    eraseFreeLocked(next);
  }
  auto after = freeByOffset_.lower_bound(offset);
  if (after != freeByOffset_.begin()) {
    auto previous = std::prev(after);
    if (previous->first + previous->second == begin) {
      begin = previous->first;
      eraseFreeLocked(previous);
    }
  }
  insertFreeLocked(begin, end - begin);

  // Give back the pages the freed allocation shares with neighbours that are free now (one shared
  // with a live neighbour must keep its contents). At most two pages, so under the lock.
  const std::uint64_t page = pageSize();
  const std::uint64_t first = offset / page * page;
  const std::uint64_t last = (offset + reserved - 1) / page * page;
  if (first >= begin && first + page <= end) dropPagesLocked(first, first + page);
  if (last != first && last >= begin && last + page <= end) dropPagesLocked(last, last + page);
}

void DeviceArena::waitForAccessesLocked(std::unique_lock<std::mutex>& lock) {
  if (accesses_ == 0) return;
  // A generation, not accesses_ == 0: the engine may start its next Access before this thread
  // wakes, and that one cannot use what was taken away before it began.
  const std::uint64_t seen = idleGeneration_;
  idle_.wait(lock, [&] { return accesses_ == 0 || idleGeneration_ != seen; });
}

DeviceArena::Access::Access(DeviceArena& arena) : arena_(&arena) {
  std::lock_guard lock(arena_->mutex_);
  ++arena_->accesses_;
}

DeviceArena::Access::~Access() {
  if (arena_ == nullptr) return;
  DeviceArena& arena = *arena_;
  {
    std::lock_guard lock(arena.mutex_);
    if (--arena.accesses_ > 0) return;
    ++arena.idleGeneration_;
    for (const auto& [offset, reserved] : arena.quarantined_) arena.retireLocked(offset, reserved);
    arena.quarantined_.clear();
  }
  arena.idle_.notify_all();
}

CUresult DeviceArena::share(CUdeviceptr pointer, backend::AddressSpace with) {
  if (pointer < base_ || pointer - base_ >= capacity_) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t offset = pointer - base_;
  std::lock_guard lock(mutex_);
  const auto found = live_.find(offset);
  if (found == live_.end()) return CUDA_ERROR_INVALID_VALUE;
  if (with == found->second.owner || !found->second.sharedWith.insert(with).second) {
    return CUDA_SUCCESS;
  }
  holdings_[with].allocations.insert(offset);
  changedLocked(with);
  return CUDA_SUCCESS;
}

void DeviceArena::unshare(CUdeviceptr pointer, backend::AddressSpace with) {
  if (pointer < base_ || pointer - base_ >= capacity_) return;
  const std::uint64_t offset = pointer - base_;
  std::lock_guard lock(mutex_);
  const auto found = live_.find(offset);
  if (found == live_.end() || found->second.sharedWith.erase(with) == 0) return;
  holdings_[with].allocations.erase(offset);
  changedLocked(with);
}

std::uint64_t DeviceArena::allocatedBytes() const {
  std::lock_guard lock(mutex_);
  return allocated_;
}

void DeviceArena::releaseAll() {
  std::unique_lock lock(mutex_);
  // A range the dropper is working on must not be handed out (and then wiped) meanwhile.
  released_.wait(lock, [&] { return dropping_ == 0; });
  live_.clear();
  reservations_.clear();
  mappings_.clear();
  for (auto& [owner, holdings] : holdings_) {
    holdings.allocations.clear();
    holdings.mappings.clear();
    holdings.version = nextVersion_++;
  }
  ++generation_;
  quarantined_.clear();
  retired_.clear();
  freeByOffset_.clear();
  freeBySize_.clear();
  allocated_ = 0;
  insertFreeLocked(0, capacity_);
  dropPagesLocked(0, capacity_ / pageSize() * pageSize());
  released_.notify_all();
}

void DeviceArena::insertFreeLocked(std::uint64_t offset, std::uint64_t size) {
  freeByOffset_.emplace(offset, size);
  freeBySize_.emplace(size, offset);
}

void DeviceArena::eraseFreeLocked(std::map<std::uint64_t, std::uint64_t>::iterator block) {
  freeBySize_.erase({block->second, block->first});
  freeByOffset_.erase(block);
}

void DeviceArena::dropPagesLocked(std::uint64_t begin, std::uint64_t end) {
  if (begin >= end) return;
  // MADV_DONTNEED on private anonymous memory frees the pages now; later reads see zeros.
  madvise(host_ + begin, end - begin, MADV_DONTNEED);
}

CUresult DeviceArena::registerHost(void* host, std::size_t bytes, backend::AddressSpace owner) {
  const auto start = reinterpret_cast<std::uintptr_t>(host);
  if (host == nullptr || bytes == 0 || start + bytes < start) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  auto next = hostRanges_.lower_bound(start);
  if (next != hostRanges_.end() && next->first < start + bytes) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (next != hostRanges_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.bytes > start) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  }
  hostRanges_.emplace(start, HostRange{bytes, owner});
  holdings_[owner].hostRanges.insert(start);
  changedLocked(owner);
  return CUDA_SUCCESS;
}

CUresult DeviceArena::unregisterHost(void* host) {
  std::unique_lock lock(mutex_);
  const auto found = hostRanges_.find(reinterpret_cast<std::uintptr_t>(host));
  if (found == hostRanges_.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  const backend::AddressSpace owner = found->second.owner;
  holdings_[owner].hostRanges.erase(found->first);
  hostRanges_.erase(found);
  changedLocked(owner);
  // The caller may unmap the range as soon as this returns.
  waitForAccessesLocked(lock);
  return CUDA_SUCCESS;
}

backend::Result<CUdeviceptr> DeviceArena::reserveAddresses(std::uint64_t bytes,
                                                           std::uint64_t alignment) {
  if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto alignUp = [alignment](std::uint64_t address) {
    return (address + alignment - 1) / alignment * alignment;
  };
  std::lock_guard lock(mutex_);
  // First fit: the lowest aligned start whose range ends before the next reservation.
  CUdeviceptr candidate = alignUp(window_.begin);
  for (const auto& [start, size] : reservations_) {
    if (candidate < start && bytes <= start - candidate) break;
    candidate = std::max<CUdeviceptr>(candidate, alignUp(start + size));
  }
  if (candidate < window_.begin || candidate >= window_.end || bytes > window_.end - candidate) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  reservations_.emplace(candidate, bytes);
  return candidate;
}

CUresult DeviceArena::freeAddresses(CUdeviceptr start, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const auto found = reservations_.find(start);
  if (found == reservations_.end() || found->second != bytes) return CUDA_ERROR_INVALID_VALUE;
  const auto mapped = mappings_.lower_bound(start);
  if (mapped != mappings_.end() && mapped->first - start < bytes) return CUDA_ERROR_INVALID_VALUE;
  reservations_.erase(found);
  return CUDA_SUCCESS;
}

CUresult DeviceArena::map(CUdeviceptr address, std::uint64_t bytes, CUdeviceptr physical,
                          std::uint64_t offset) {
  if (bytes == 0 || physical < base_ || physical - base_ >= capacity_) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(mutex_);
  // Inside one reservation...
  auto reservation = reservations_.upper_bound(address);
  if (reservation == reservations_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --reservation;
  const std::uint64_t into = address - reservation->first;
  if (into >= reservation->second || bytes > reservation->second - into) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // ...over nothing mapped...
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first - address < bytes) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin() &&
      std::prev(next)->first + std::prev(next)->second.bytes > address) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // ...of a range of one physical allocation.
  const auto allocation = live_.find(physical - base_);
  if (allocation == live_.end() || allocation->second.owner != backend::kDaemonAddressSpace ||
      offset >= allocation->second.requested || bytes > allocation->second.requested - offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++allocation->second.mappings;
  mappings_.emplace(address, Mapping{bytes, allocation->first, offset, std::nullopt});
  return CUDA_SUCCESS;
}

std::map<CUdeviceptr, DeviceArena::Mapping>::iterator DeviceArena::mappingLocked(
    CUdeviceptr address, std::uint64_t bytes) {
  const auto found = mappings_.find(address);
  return found != mappings_.end() && found->second.bytes == bytes ? found : mappings_.end();
}

void DeviceArena::revokeAccessLocked(std::map<CUdeviceptr, Mapping>::iterator mapping) {
  if (!mapping->second.accessor) return;
  holdings_[*mapping->second.accessor].mappings.erase(mapping->first);
  changedLocked(*mapping->second.accessor);
  mapping->second.accessor.reset();
}

CUresult DeviceArena::unmap(CUdeviceptr address, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const auto mapping = mappingLocked(address, bytes);
  if (mapping == mappings_.end()) return CUDA_ERROR_INVALID_VALUE;
  revokeAccessLocked(mapping);
  --live_.at(mapping->second.physical).mappings;
  mappings_.erase(mapping);
  return CUDA_SUCCESS;
}

CUresult DeviceArena::setAccess(CUdeviceptr address, std::uint64_t bytes,
                                backend::AddressSpace owner, bool writable) {
  std::lock_guard lock(mutex_);
  const auto mapping = mappingLocked(address, bytes);
  if (mapping == mappings_.end()) return CUDA_ERROR_INVALID_VALUE;
  revokeAccessLocked(mapping);
  if (writable) {
    mapping->second.accessor = owner;
    holdings_[owner].mappings.insert(mapping->first);
    changedLocked(owner);
  }
  return CUDA_SUCCESS;
}

std::byte* DeviceArena::Access::translate(CUdeviceptr address, std::size_t bytes) const {
  const DeviceArena& arena = *arena_;
  std::lock_guard lock(arena.mutex_);
  if (arena.inWindow(address)) {
    // Reserved addresses: memory only where a mapping is, and only once someone may reach it.
    auto mapping = arena.mappings_.upper_bound(address);
    if (mapping == arena.mappings_.begin()) return nullptr;
    --mapping;
    const std::uint64_t into = address - mapping->first;
    if (!mapping->second.accessor || into >= mapping->second.bytes ||
        bytes > mapping->second.bytes - into) {
      return nullptr;
    }
    return arena.host_ + mapping->second.physical + mapping->second.offset + into;
  }
  if (address < arena.base_ || address - arena.base_ >= arena.capacity_) {
    // Not device memory: perhaps registered host memory, which kernels reach at its own address.
    auto holder = arena.hostRanges_.upper_bound(address);
    if (holder == arena.hostRanges_.begin()) return nullptr;
    --holder;
    const std::uint64_t offset = address - holder->first;
    if (offset >= holder->second.bytes || bytes > holder->second.bytes - offset) return nullptr;
    return reinterpret_cast<std::byte*>(address);
  }
  const std::uint64_t offset = address - arena.base_;
  auto holder = arena.live_.upper_bound(offset);
  if (holder == arena.live_.begin()) return nullptr;
  --holder;
  const std::uint64_t start = holder->first;
  const std::uint64_t limit = start + holder->second.requested;
  if (offset >= limit || bytes > limit - offset) return nullptr;
  return arena.host_ + offset;
}

}  // namespace gpuproxy::server::sim

namespace gpuproxy::server::sim {

std::vector<ptx::MemoryRange> DeviceArena::Access::rangesOf(backend::AddressSpace owner,
                                                            std::uint64_t& version) const {
  const DeviceArena& arena = *arena_;
  std::lock_guard lock(arena.mutex_);
  std::vector<ptx::MemoryRange> ranges;
  const auto found = arena.holdings_.find(owner);
  version = found == arena.holdings_.end() ? 0 : found->second.version;
  if (found == arena.holdings_.end()) return ranges;
  for (const std::uint64_t offset : found->second.allocations) {
    const Allocation& allocation = arena.live_.at(offset);
    const CUdeviceptr begin = arena.base_ + offset;
    const std::uint64_t writable = std::min(allocation.readOnlyFrom, allocation.requested);
    if (writable > 0) {
      ranges.push_back({begin, begin + writable, arena.host_ + offset, true});
    }
    if (writable < allocation.requested) {
      ranges.push_back(
          {begin + writable, begin + allocation.requested, arena.host_ + offset + writable, false});
    }
  }
  for (const std::uintptr_t start : found->second.hostRanges) {
    const HostRange& range = arena.hostRanges_.at(start);
    ranges.push_back({start, start + range.bytes, reinterpret_cast<std::byte*>(start), true});
  }
  for (const CUdeviceptr start : found->second.mappings) {
    const Mapping& mapping = arena.mappings_.at(start);
    ranges.push_back(
        {start, start + mapping.bytes, arena.host_ + mapping.physical + mapping.offset, true});
  }
  return ranges;
}

std::uint64_t DeviceArena::Access::versionOf(backend::AddressSpace owner) const {
  const DeviceArena& arena = *arena_;
  std::lock_guard lock(arena.mutex_);
  const auto found = arena.holdings_.find(owner);
  return found == arena.holdings_.end() ? 0 : found->second.version;
}

}  // namespace gpuproxy::server::sim
