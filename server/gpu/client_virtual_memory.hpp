#pragma once
// One client's virtual memory management on one GPU (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree): its address reservations, its
// physical memory and the mappings of the one into the other. Every address and handle a client
// names is checked against these tables, so it reaches only what it made; its kernels, copies and
// memsets reach a mapping once its access is set (reaches()).
//
// As in CUDA, they are the process's (this client's on this GPU), not a context's: cuCtxDestroy
// leaves memory made by cuMemCreate, its reservations and mappings alone, so a program may destroy
// its context and then unmap and free. They go when the client gives them back, or with the
// client. Physical memory is charged to the tenant when made (by the GpuClient, which hands the
// charge over) and credited when it is given back: once it is released and no longer mapped, on
// the GPU's blocking-call thread (GpuShard::releasePhysicalMemory). Owner thread only, as the
// GpuClient.

#include "server/backend/backend.hpp"
#include "server/gpu/handles.hpp"
#include "server/gpu/memory_charge.hpp"
#include "server/gpu/physical_memory.hpp"

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace gpuproxy::server {

class GpuShard;

class ClientVirtualMemory {
public:
  ClientVirtualMemory(GpuShard& shard, backend::AddressSpace owner, pid_t pid)
      : shard_(shard), owner_(owner), pid_(pid) {}
  // Gives back everything still held: its mappings unmapped, its physical memory released, its
  // reservations freed.
  ~ClientVirtualMemory();
  ClientVirtualMemory(const ClientVirtualMemory&) = delete;
  ClientVirtualMemory& operator=(const ClientVirtualMemory&) = delete;

  // `bytes` (a nonzero multiple of the host page size) of device addresses, aligned to
  // `alignment` (0 or a power of two) at least. CUDA_ERROR_OUT_OF_MEMORY when the device has no
  // room, or the client holds kMaxVirtualMemoryObjects objects already.
  backend::Result<CUdeviceptr> reserve(std::uint64_t bytes, std::uint64_t alignment);
  // `start` and `bytes` exactly as reserved, nothing mapped inside; CUDA_ERROR_INVALID_VALUE
  // otherwise.
  CUresult freeReservation(CUdeviceptr start, std::uint64_t bytes);
  // Whether `address` lies in one of the client's reservations here.
  bool reserves(CUdeviceptr address) const;

  // Whether the client may make one more object (a reservation, physical memory, a mapping).
  bool hasRoom() const;
  // Whether the client holds any reservation, physical memory or mapping here.
  bool holdsAny() const;
  // Physical memory named `handle` for the client: memory it made, or another client's it
  // imported. Shared with every other holder; given back when the last lets go.
  void addPhysical(Handle handle, std::shared_ptr<PhysicalMemory> memory);
  // The memory `handle` names, while the client holds the handle; null otherwise.
  std::shared_ptr<PhysicalMemory> physical(Handle handle) const;
  // The client lets go of `handle`; it lets go of the memory once it maps it nowhere.
  // CUDA_ERROR_INVALID_VALUE for a handle it does not hold.
  CUresult release(Handle handle);

  // [offset, offset + bytes) of `handle`'s memory behind [address, address + bytes): inside one
  // reservation, over nothing mapped, multiples of the granularity. Not reachable until
  // setAccess. CUDA_ERROR_INVALID_VALUE otherwise.
  CUresult map(CUdeviceptr address, std::uint64_t bytes, std::uint64_t offset, Handle handle);
  // Removes the mappings that exactly make up [address, address + bytes). The caller has waited
  // for the client's work that may use them.
  CUresult unmap(CUdeviceptr address, std::uint64_t bytes);
  // Read and write access for the client's kernels, copies and memsets (`writable`), or none, to
  // the mappings that exactly make up [address, address + bytes).
  CUresult setAccess(CUdeviceptr address, std::uint64_t bytes, bool writable);
  // Whether [pointer, pointer + bytes) lies inside one mapping the client may reach.
  bool reaches(CUdeviceptr pointer, std::uint64_t bytes) const;

private:
  struct Reservation {
    std::uint64_t bytes = 0;
  };
  struct Physical {
    std::shared_ptr<PhysicalMemory> memory;
    bool released = false;  // the client let go of the handle
    unsigned mappings = 0;
  };
  struct Mapping {
    std::uint64_t bytes = 0;
    Handle physical = 0;
    bool writable = false;
  };
  using Mappings = std::map<CUdeviceptr, Mapping>;

  // The mappings that exactly make up [address, address + bytes), in order; empty when they do
  // not.
  std::vector<Mappings::iterator> mappingsMakingUp(CUdeviceptr address, std::uint64_t bytes);
  // Unmaps one mapping from the device and forgets it; gives its memory back if that was the
  // last mapping of released memory.
  void unmapOne(Mappings::iterator mapping);
  // Lets go of physical memory if the client released it and maps it nowhere (the memory goes
  // back to the device when its last holder lets go: PhysicalMemory).
  void giveBackIfUnused(std::map<Handle, Physical>::iterator physical);

  GpuShard& shard_;
  const backend::AddressSpace owner_;
  const pid_t pid_;
  std::map<CUdeviceptr, Reservation> reservations_;  // by start
  std::map<Handle, Physical> physical_;
  Mappings mappings_;  // by start
};

}  // namespace gpuproxy::server
