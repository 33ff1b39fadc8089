#include "server/gpu/physical_memory.hpp"

#include "server/gpu/gpu_shard.hpp"

namespace gpuproxy::server {

PhysicalMemory::~PhysicalMemory() {
  // The device has it back on the blocking-call thread; the charge goes back with charge_ now, as
  // every later allocation reaches the device after this release (GpuShard).
  shard_.releasePhysicalMemory(backendHandle_, charge_.bytes(), maker_);
}

}  // namespace gpuproxy::server
