#pragma once
// The `sim` backend: an honest GPU simulator for machines without one (CI, laptops, demos). It
// names itself "sim" and its devices "gpuproxy sim device N" everywhere they are reported.
//
// What is real: device memory (a host arena with device-like addresses and exact capacity),
// copies, memsets, stream ordering, events, callbacks, sticky faults. What is simulated: the GPU
// itself. Kernels are PTX, run by an interpreter with a GPU's semantics (server/backend/ptx): a
// kernel may touch only the memory of its launching client's address space, and PTX that the
// interpreter cannot execute is refused at load time rather than pretended.

#include <chrono>
#include <cstdint>
#include <memory>

#include "server/backend/backend.hpp"

namespace gpuproxy::server::sim {

struct SimOptions {
  int devices = 1;                          // 0..256
  std::uint64_t memoryBytes = 16ull << 30;  // per device; 1 byte .. 1 TiB, rounded down to 256
  // Threads that run a launch's blocks beside the device's engine thread; -1: one per core
  // beyond the first.
  int workerThreads = -1;
  // Makes preparing a module on device `slowModuleLoadDevice` take at least `moduleLoadDelay`, as
  // a large PTX JIT does on a GPU: for testing that a slow load stalls no one else. -1: none.
  int slowModuleLoadDevice = -1;
  std::chrono::milliseconds moduleLoadDelay{0};
};

// Throws std::invalid_argument when the options are out of range.
std::unique_ptr<backend::Backend> newSimBackend(const SimOptions& options);

// Device i's addresses start at kSimAddressBase + i * kSimAddressStride. The base lies just above
// the 47-bit user address space that Linux hands out by default (x86-64 and arm64), so a sim device
// pointer is never 0 and can never be mistaken for a host pointer of the daemon or of a client,
// while still fitting the 49-bit virtual addresses real GPUs use.
inline constexpr std::uint64_t kSimAddressBase = 1ull << 48;
inline constexpr std::uint64_t kSimAddressStride = 1ull << 40;

}  // namespace gpuproxy::server::sim
