#pragma once
// The attribute table a sim device answers cuDeviceGetAttribute from.

#include <cstdint>
#include <utility>
#include <vector>

#include "server/backend/sim/sim_backend.hpp"

namespace gpuproxy::server::sim {

// Registers of one multiprocessor, which is also the most one block may use.
inline constexpr std::uint32_t kSimRegistersPerSm = 65536;

// Every CUdevice_attribute from 1 to CU_DEVICE_ATTRIBUTE_MAX - 1, as (attribute, value), modelled
// on an H100 SXM5 (compute capability 9.0). Features the sim does not provide (textures, IPC,
// VMM, ...) answer 0 so that programs take their fallback paths instead of calling
// entry points that would fail. `pciBusId` tells devices apart as real ones are.
// `computeCapability` (major * 10 + minor) is what the device reports as its compute capability;
// the rest of the table stays an H100's.
std::vector<std::pair<int, int>> simDeviceAttributes(
    int pciBusId, unsigned computeCapability = kSimComputeCapability);

// How many blocks of `threadsPerBlock` threads using `sharedBytesPerBlock` of shared memory (static
// and dynamic) and `registersPerThread` registers a sim device holds at once, over all its
// multiprocessors: the largest grid a cooperative launch may have.
std::uint64_t simResidentBlocks(std::uint64_t threadsPerBlock, std::uint64_t sharedBytesPerBlock,
                                int registersPerThread);

}  // namespace gpuproxy::server::sim
