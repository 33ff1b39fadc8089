#pragma once
// The `sim` backend: an honest GPU simulator for machines without one (CI, laptops, demos). It
// names itself "sim" and its devices "gpuproxy sim device N" everywhere they are reported.
//
// What is real: device memory (a host arena with device-like addresses and exact capacity),
// copies, memsets, stream ordering, events, callbacks, sticky faults. What is simulated: the GPU
// itself. Kernels are PTX, run by an interpreter with a GPU's semantics (server/backend/ptx): a
// kernel may touch only the memory of its launching client's address space, and a kernel that
// the interpreter cannot execute is refused (at its launch, or at load when the module has no
// kernel it can run) rather than pretended.

#include <chrono>
#include <cstdint>
#include <memory>

#include "server/backend/backend.hpp"

namespace gpuproxy::server::sim {

// The compute capability a sim device reports unless told otherwise, as major * 10 + minor (9.0:
// an H100).
inline constexpr unsigned kSimComputeCapability = 90;
// Those a sim device may report (SimOptions::computeCapability): real GPUs' that the PTX
// interpreter serves, so that libraries pick the builds of their kernels made for them.
inline constexpr unsigned kSimComputeCapabilities[] = {75, 80, 86, 89, 90, 100, 120};

// A call that takes `delay` longer on device `device` (-1: on none).
struct SlowCall {
  int device = -1;
  std::chrono::milliseconds delay{0};
  std::chrono::milliseconds on(int index) const {
    return index == device ? delay : std::chrono::milliseconds{0};
  }
};

struct SimOptions {
  int devices = 1;                          // 0..256
  std::uint64_t memoryBytes = 16ull << 30;  // per device; 1 byte .. 1 TiB, rounded down to 256
  // Threads that run a launch's blocks beside the device's engine thread; -1: one per core
  // beyond the first.
  int workerThreads = -1;
  // Calls made slow on one device, as they can be on a GPU: for testing that they stall no one
  // else. Loading a module (a large PTX JIT), giving device memory back (cuMemFree and a
  // module's unload, which may wait for the device), and resetting the context after a sticky
  // fault (recreating it, registering clients' pinned memory in it again).
  SlowCall slowModuleLoad = {};
  SlowCall slowFree = {};
  SlowCall slowReset = {};
  // The compute capability the devices report (major * 10 + minor; one of
  // kSimComputeCapabilities), and so the PTX a fatbin loads from: 9.0, an H100, unless told.
  // Libraries that ship PTX only for the newest GPUs (cuSPARSE, cuBLAS's level-1 and -2 kernels)
  // pick the builds of their kernels made for 12.0 when the device says 12.0, whose PTX the sim
  // then runs as it was built; the rest of the device is still modelled on an H100.
  unsigned computeCapability = kSimComputeCapability;
};

// Throws std::invalid_argument when the options are out of range.
std::unique_ptr<backend::Backend> newSimBackend(const SimOptions& options);

// Device i's addresses start at kSimAddressBase + i * kSimAddressStride. The base lies just above
// the 47-bit user address space that Linux hands out by default (x86-64 and arm64), so a sim device
// pointer is never 0 and can never be mistaken for a host pointer of the daemon or of a client,
// while still fitting the 49-bit virtual addresses real GPUs use.
inline constexpr std::uint64_t kSimAddressBase = 1ull << 48;
inline constexpr std::uint64_t kSimAddressStride = 1ull << 40;
// Where the daemon maps each device's memory in its own address space, device after device in
// 1 GiB-aligned slots: 17 TiB up, below the data planes' segments (ipc::AddressReservation's hints
// from 32 TiB) and far below where the kernel puts processes' mappings. Not 16 TiB: under
// AddressSanitizer that is the end of its shadow memory, and the kernel then placed the arena
// among the mappings where clients' own memory lies (which DEVICEMAP registration maps at the
// same address in the daemon).
inline constexpr std::uint64_t kSimHostBase = (1ull << 44) + (1ull << 40);
inline constexpr std::uint64_t kSimHostSlotAlignment = 1ull << 30;

}  // namespace gpuproxy::server::sim
