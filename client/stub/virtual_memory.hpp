#pragma once
// What this process holds of virtual memory management (cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess; client/stub/api/virtual_memory.cpp). The daemon keeps the same and
// checks every call against it (server/gpu/client_virtual_memory.hpp); the stub keeps its copy to
// answer what the driver answers without asking anyone (cuMemGetAccess,
// cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle), to count a handle's
// references (the daemon hears of a handle's release when the last one goes), and to know which
// device the memory behind a range is on (cuMemSetAccess). As in CUDA, everything here is the
// process's, not a context's: it stays when the context it was made in is destroyed, until the
// process gives it back.

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace gpuproxy::stub {

class VirtualMemoryTable {
public:
  struct Physical {
    std::uint64_t bytes = 0;
    CUmemAllocationProp prop{};  // as cuMemCreate was given it
    unsigned references = 1;     // cuMemCreate's, and one per cuMemRetainAllocationHandle
  };
  struct Mapping {
    std::uint64_t bytes = 0;
    std::uint64_t handle = 0;
    std::uint64_t context = 0;  // the reservation's (copies name the range as its memory)
    int device = 0;             // the memory's
    CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  };

  void addReservation(CUdeviceptr start, std::uint64_t bytes, std::uint64_t context);
  void forgetReservation(CUdeviceptr start);
  // The context the reservation `address` lies in was made in; nullopt for none of this process's.
  std::optional<std::uint64_t> reservationContext(CUdeviceptr address) const;

  void addPhysical(std::uint64_t handle, Physical physical);
  std::optional<Physical> physical(std::uint64_t handle) const;
  // One more reference to a handle this process holds; false for an unknown one.
  bool retain(std::uint64_t handle);
  // One reference fewer: nullopt for an unknown handle, else whether it was the last (the handle
  // is forgotten then, and the daemon must be told).
  std::optional<bool> release(std::uint64_t handle);

  void addMapping(CUdeviceptr start, Mapping mapping);
  // The mappings that start in [start, start + bytes), in order.
  std::vector<std::pair<CUdeviceptr, Mapping>> mappingsIn(CUdeviceptr start,
                                                          std::uint64_t bytes) const;
  void forgetMappingsIn(CUdeviceptr start, std::uint64_t bytes);
  void setAccess(CUdeviceptr start, std::uint64_t bytes, CUmemAccess_flags access);
  // The mapping `address` lies in, with its start.
  std::optional<std::pair<CUdeviceptr, Mapping>> mappingAt(CUdeviceptr address) const;

private:
  mutable std::mutex mutex_;
  struct Reservation {
    std::uint64_t bytes = 0;
    std::uint64_t context = 0;
  };
  std::map<CUdeviceptr, Reservation> reservations_;  // by start
  std::map<std::uint64_t, Physical> physical_;       // by handle
  std::map<CUdeviceptr, Mapping> mappings_;          // by start
};

}  // namespace gpuproxy::stub
