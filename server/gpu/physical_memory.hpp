#pragma once
// Physical memory of one GPU made by cuMemCreate, shared by every client that holds a handle to it
// or maps it: the client that made it, and those that imported it from a shareable handle
// (cuMemExportToShareableHandle, cuMemImportFromShareableHandle). Its charge is its maker's, for
// as long as anyone holds it (as memory opened by an interprocess handle stays its exporter's).
// When the last holder lets go, the memory goes back to the device on the GPU's blocking-call
// thread (GpuShard::releasePhysicalMemory) and the charge to its maker's tenant at once.
// Owner thread only: every holder is a client of the same GPU.

#include "server/gpu/memory_charge.hpp"

#include <sys/types.h>

#include <cstdint>

namespace gpuproxy::server {

class GpuShard;

class PhysicalMemory {
public:
  // `backendHandle` is what backend::Device::createPhysicalMemory gave; `charge` what it costs.
  PhysicalMemory(GpuShard& shard, std::uint64_t backendHandle, MemoryCharge charge, pid_t maker)
      : shard_(shard), backendHandle_(backendHandle), charge_(std::move(charge)), maker_(maker) {}
  ~PhysicalMemory();
  PhysicalMemory(const PhysicalMemory&) = delete;
  PhysicalMemory& operator=(const PhysicalMemory&) = delete;

  std::uint64_t backendHandle() const { return backendHandle_; }
  std::uint64_t bytes() const { return charge_.bytes(); }

private:
  GpuShard& shard_;
  const std::uint64_t backendHandle_;
  MemoryCharge charge_;
  const pid_t maker_;
};

}  // namespace gpuproxy::server
