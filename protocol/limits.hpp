#pragma once
// Limits and defaults both sides of gpuproxy rely on, defined once. Each is either part of the
// protocol (a value the peer must agree on) or a default the daemon, the stub and gpuproxyctl
// must share; the format constants of the ring records are in ring_format.hpp.

#include <cstddef>
#include <cstdint>

namespace gpuproxy::protocol {

// Where gpuproxyd listens by default, and so where the stub and gpuproxyctl look.
inline constexpr const char* kDefaultClientSocket = "/run/gpuproxy/gpuproxy.sock";
inline constexpr const char* kDefaultAdminSocket = "/run/gpuproxy/admin.sock";

// File descriptors one control message may carry: a session's data-plane segment and doorbell.
inline constexpr unsigned kMaxFdsPerMessage = 4;

// The largest control message. Bulk data travels in pieces of at most maxTransferChunk (4 MiB,
// gpuproxy.capnp): copies over Session.submit, module images over appendModuleImage. A peer that
// sends more is cut off, so one connection costs the daemon at most this much to read a message.
inline constexpr std::uint64_t kMaxControlMessageBytes = std::uint64_t{16} << 20;

// CUDA's limit on a kernel's parameter buffer (12.1+, Volta and later).
inline constexpr std::uint32_t kMaxKernelParameterBytes = 32764;

// The pinned host heap of a client's data-plane segment: what the stub asks for unless
// GPUPROXY_PINNED_HEAP says otherwise, and the most the daemon grants whatever it is asked (it is
// address space and, once touched, memory of the daemon's mapping too; the tenant's
// pinned_memory_limit bounds what a client can actually pin).
inline constexpr std::uint64_t kDefaultPinnedHeapBytes = std::uint64_t{256} << 20;
inline constexpr std::uint64_t kMaxPinnedHeapBytes = std::uint64_t{1} << 30;
// Host ranges one session may have registered at once (cuMemHostRegister): each is a mapping in
// the daemon, and the kernel caps a process's mappings (vm.max_map_count, 65530 by default).
inline constexpr std::size_t kMaxHostRangesPerSession = 1024;
// Host functions (cuLaunchHostFunc, cuStreamAddCallback) one session may have waiting to run or
// running at once on one GPU; each holds its stream in the daemon until the client says it
// returned.
inline constexpr std::size_t kMaxPendingHostFunctions = 65536;
// Streams one session may have held on one GPU for other GPUs' events (HoldForEvent), and
// let-gos it may have sent ahead of their holds (LetGoAfterEvent) that one GPU remembers.
inline constexpr std::size_t kMaxPendingWaitsForOtherGpus = 65536;

// A context's resource limits as the driver sets them (cuCtxGetLimit before any cuCtxSetLimit).
inline constexpr std::uint64_t kDefaultStackBytes = 1024;                         // per thread
inline constexpr std::uint64_t kDefaultPrintfFifoBytes = std::uint64_t{1} << 20;  // printf()
inline constexpr std::uint64_t kDefaultMallocHeapBytes = std::uint64_t{8} << 20;  // malloc()
// The most device printf output the daemon keeps for one client between two of its
// synchronisations, whatever CU_LIMIT_PRINTF_FIFO_SIZE asks for: it is the daemon's own memory.
inline constexpr std::uint64_t kMaxPrintfFifoBytes = std::uint64_t{64} << 20;

// Virtual memory management (cuMemCreate, cuMemMap): the granularity of physical memory and of
// mappings, as cuMemGetAllocationGranularity reports it (minimum and recommended alike), 2 MiB as
// on every GPU of these generations; and the most reservations, physical allocations and
// mappings one client may hold on one device together (each is an entry in the daemon's tables).
inline constexpr std::uint64_t kVirtualMemoryGranularity = std::uint64_t{2} << 20;
inline constexpr std::size_t kMaxVirtualMemoryObjects = 65536;

}  // namespace gpuproxy::protocol
