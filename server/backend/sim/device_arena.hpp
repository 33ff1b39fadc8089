#pragma once
// Device memory of one sim device: a reserved host mapping of the device's full capacity (no RAM
// until touched), handed out at device-like addresses with cudaMalloc's 256-byte alignment.
//
// Threading: allocate/free/memoryInfo come from the device's owner thread, translation from the
// engine thread. The lock is only held for bookkeeping, never across the engine's work: memory
// freed while an Access is alive is set aside (not reused, its pages kept) until the Access ends,
// so the engine never sees memory it translated change under it, and the owner thread (the
// GPU's thread in the daemon) never waits for a copy or a kernel to finish to allocate or free. Nor
// does it give the freed pages back itself (tens of milliseconds for a few hundred MiB): a helper
// thread of the arena does, and only then is the range handed out again.

#include <cuda.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "server/backend/backend.hpp"
#include "server/backend/ptx/ptx_exec.hpp"

namespace gpuproxy::server::sim {

inline constexpr std::uint64_t kAllocationAlignment = 256;

// Device addresses that DeviceArena::reserveAddresses hands out: [begin, end), outside the
// arena's own.
struct AddressWindow {
  CUdeviceptr begin = 0;
  CUdeviceptr end = 0;
};

class DeviceArena final {
public:
  // Reserves `capacity` bytes (a multiple of kAllocationAlignment) whose device addresses start at
  // `base`, in the daemon's address space at `hostHint` if that is free (else wherever the kernel
  // puts it). Returns nullptr when the address space cannot be reserved, or `reservable`
  // overlaps the arena's addresses.
  static std::unique_ptr<DeviceArena> create(CUdeviceptr base, std::uint64_t capacity,
                                             void* hostHint = nullptr,
                                             AddressWindow reservable = {});
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // What an allocation of `bytes` takes from the arena: whole kAllocationAlignment granules.
  static std::uint64_t reservedBytes(std::size_t bytes) {
    return (std::uint64_t{bytes} + kAllocationAlignment - 1) / kAllocationAlignment *
           kAllocationAlignment;
  }

  // CUDA_ERROR_INVALID_VALUE for 0 bytes, CUDA_ERROR_OUT_OF_MEMORY when no free range fits.
  // Kernels of `owner` may touch it; from `readOnlyFrom` bytes on, only read it (a module's
  // constant memory).
  backend::Result<CUdeviceptr> allocate(std::size_t bytes,
                                        backend::AddressSpace owner = backend::kDaemonAddressSpace,
                                        std::uint64_t readOnlyFrom = ~0ull);
  // CUDA_ERROR_INVALID_VALUE unless `pointer` is the start of a live allocation.
  CUresult free(CUdeviceptr pointer);
  // Kernels of `with` may touch allocation `pointer` too, until unshare() or its free
  // (interprocess memory). CUDA_ERROR_INVALID_VALUE unless `pointer` starts a live allocation.
  CUresult share(CUdeviceptr pointer, backend::AddressSpace with);
  void unshare(CUdeviceptr pointer, backend::AddressSpace with);
  std::uint64_t allocatedBytes() const;
  std::uint64_t capacity() const { return capacity_; }
  // Frees every allocation and returns all pages to the system (registered host memory stays).
  void releaseAll();
  // Bumped by every reset: memory handed out before a reset must not be freed after it.
  std::uint64_t generation() const;

  // Virtual memory management (backend::Device::reserveAddresses, ...). A reservation is a range
  // of the window create() was given, at an `alignment` (a power of two) boundary; physical memory
  // is an allocation of kDaemonAddressSpace's (allocate), which no client's kernels reach but
  // through a mapping, and which free() refuses while it is mapped. A mapping puts
  // [offset, offset + bytes) of one behind [address, address + bytes) of one reservation, over
  // nothing mapped; setAccess lets `owner`'s kernels (and translate) reach the mapping that is
  // exactly [address, address + bytes), and unmap removes it. CUDA_ERROR_INVALID_VALUE for
  // anything else; CUDA_ERROR_OUT_OF_MEMORY when the window has no room.
  backend::Result<CUdeviceptr> reserveAddresses(std::uint64_t bytes, std::uint64_t alignment);
  CUresult freeAddresses(CUdeviceptr start, std::uint64_t bytes);
  CUresult map(CUdeviceptr address, std::uint64_t bytes, CUdeviceptr physical,
               std::uint64_t offset);
  CUresult unmap(CUdeviceptr address, std::uint64_t bytes);
  // `writable`: `owner`'s kernels may read and write the mappings; otherwise no one may.
  CUresult setAccess(CUdeviceptr address, std::uint64_t bytes, backend::AddressSpace owner,
                     bool writable);

  // Host memory that kernels may use as device-mapped memory at its own address (pinned memory).
  // unregisterHost waits for any Access in progress, so once it returns no kernel touches the
  // range.
  CUresult registerHost(void* host, std::size_t bytes,
                        backend::AddressSpace owner = backend::kDaemonAddressSpace);
  CUresult unregisterHost(void* host);

  // While one is alive, what it translated stays as it was: freed memory is neither reused nor
  // dropped, and registered host memory stays registered.
  class Access {
  public:
    ~Access();
    Access(Access&& other) noexcept : arena_(std::exchange(other.arena_, nullptr)) {}
    Access(const Access&) = delete;
    Access& operator=(const Access&) = delete;
    Access& operator=(Access&&) = delete;
    // Host address of [address, address + bytes) when it lies inside one live allocation or one
    // registered host range; nullptr otherwise.
    std::byte* translate(CUdeviceptr address, std::size_t bytes) const;
    // Everything `owner`'s kernels may touch: its allocations and registered host memory, as
    // they are now. `version` is set to a number that changes whenever that set does.
    std::vector<ptx::MemoryRange> rangesOf(backend::AddressSpace owner,
                                           std::uint64_t& version) const;
    // The version rangesOf() would report now.
    std::uint64_t versionOf(backend::AddressSpace owner) const;

  private:
    friend class DeviceArena;
    explicit Access(DeviceArena& arena);
    DeviceArena* arena_;  // null once moved from
  };
  Access access() { return Access(*this); }

private:
  DeviceArena(CUdeviceptr base, std::byte* host, std::uint64_t capacity, AddressWindow reservable);
  void insertFreeLocked(std::uint64_t offset, std::uint64_t size);
  void eraseFreeLocked(std::map<std::uint64_t, std::uint64_t>::iterator block);
  void dropPagesLocked(std::uint64_t begin, std::uint64_t end);
  // Returns a freed allocation's range to the free lists and drops the pages it shares with
  // free neighbours; the pages wholly inside it have been dropped already.
  void releaseRangeLocked(std::uint64_t offset, std::uint64_t reserved);
  // Hands a freed range (no Access can reach it) to the dropper.
  void retireLocked(std::uint64_t offset, std::uint64_t reserved);
  bool releasePendingLocked() const;
  // The dropper thread: gives back the pages of retired ranges, then releases them.
  void dropperMain();
  // Blocks until no Access that was alive when called is alive any more.
  void waitForAccessesLocked(std::unique_lock<std::mutex>& lock);

  struct Allocation {
    std::uint64_t requested = 0;  // what the caller asked for: accesses beyond it fault
    std::uint64_t reserved = 0;   // rounded up to kAllocationAlignment: what it costs
    backend::AddressSpace owner = backend::kDaemonAddressSpace;
    std::uint64_t readOnlyFrom = ~0ull;
    std::set<backend::AddressSpace> sharedWith;  // share()
    unsigned mappings = 0;                       // map() of it as physical memory
  };
  // Physical memory (an allocation, at arena offset `physical`) behind device addresses of a
  // reservation.
  struct Mapping {
    std::uint64_t bytes = 0;
    std::uint64_t physical = 0;                     // the allocation's arena offset
    std::uint64_t offset = 0;                       // into the allocation
    std::optional<backend::AddressSpace> accessor;  // setAccess; none: nobody reaches it
  };
  // The mapping that is exactly [address, address + bytes); mappings_.end() when there is none.
  std::map<CUdeviceptr, Mapping>::iterator mappingLocked(CUdeviceptr address, std::uint64_t bytes);
  // Nobody reaches `mapping` any more.
  void revokeAccessLocked(std::map<CUdeviceptr, Mapping>::iterator mapping);
  bool inWindow(CUdeviceptr address) const {
    return address >= window_.begin && address < window_.end;
  }
  struct HostRange {
    std::size_t bytes = 0;
    backend::AddressSpace owner = backend::kDaemonAddressSpace;
  };
  // What one owner holds, so that a launch gathers its ranges without looking at anyone else's.
  struct Holdings {
    std::set<std::uint64_t> allocations;  // offsets in live_
    std::set<std::uintptr_t> hostRanges;  // starts in hostRanges_
    std::set<CUdeviceptr> mappings;       // starts in mappings_ it may reach
    std::uint64_t version = 0;
  };
  void changedLocked(backend::AddressSpace owner);

  const CUdeviceptr base_;
  std::byte* const host_;
  const std::uint64_t capacity_;
  const AddressWindow window_;
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Allocation> live_;                      // by offset
  std::map<std::uint64_t, std::uint64_t> freeByOffset_;           // offset -> size
  std::set<std::pair<std::uint64_t, std::uint64_t>> freeBySize_;  // (size, offset): best fit
  std::uint64_t allocated_ = 0;
  std::map<std::uintptr_t, HostRange> hostRanges_;     // registered host memory, by start
  std::map<CUdeviceptr, std::uint64_t> reservations_;  // reserveAddresses: start -> bytes
  std::map<CUdeviceptr, Mapping> mappings_;            // by start
  std::map<backend::AddressSpace, Holdings> holdings_;
  std::uint64_t nextVersion_ = 1;
  std::uint64_t generation_ = 0;
  unsigned accesses_ = 0;             // Accesses alive
  std::uint64_t idleGeneration_ = 0;  // bumped whenever accesses_ drops to 0
  std::condition_variable idle_;
  // Freed while an Access was alive: (offset, reserved), retired once none is.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> quarantined_;
  // Retired, waiting for the dropper: (offset, reserved).
  std::deque<std::pair<std::uint64_t, std::uint64_t>> retired_;
  unsigned dropping_ = 0;             // ranges the dropper works on outside the lock
  std::condition_variable released_;  // a range went back to the free lists (or none is pending)
  std::condition_variable retiredWork_;
  bool stopping_ = false;
  std::thread dropper_;  // last: starts once everything it uses exists
};

}  // namespace gpuproxy::server::sim
