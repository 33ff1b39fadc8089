#pragma once
// What an instruction handler sees while it runs: the executing warp's current frame (registers,
// predicates, parameters), the block (shared and local memory, its indices), the launch (kernel
// parameters, the memory the launching client may touch) and where a fault is recorded.
//
// Generic addresses: global and constant memory are device addresses (a launch may touch only
// the ranges in its MemoryMap); shared, local and kernel-parameter memory are windows of the
// generic address space (cvta adds the window's base), each resolved per block or per thread.

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "server/backend/ptx/ptx_program.hpp"

namespace gpuproxy::server::ptx {

// Generic-address windows. They lie between the 47-bit user address space (host memory that
// kernels may reach when it is registered) and the sim's device addresses (from 2^48).
inline constexpr std::uint64_t kSharedWindow = 0x0000'8000'0000'0000ull;
inline constexpr std::uint64_t kLocalWindow = 0x0000'8001'0000'0000ull;
inline constexpr std::uint64_t kParamWindow = 0x0000'8002'0000'0000ull;
inline constexpr std::uint64_t kWindowBytes = 0x0000'0001'0000'0000ull;
// Functions have addresses (for indirect calls and vtables) that are not memory.
inline constexpr std::uint64_t kFunctionWindow = 0x0000'8003'0000'0000ull;
inline constexpr std::uint64_t kFunctionStride = 16;
// Addresses in the .param state space: a kernel's parameter buffer from 0, the frame's
// parameter block (a function's own parameters, call-site arguments) from kFrameParamBase.
inline constexpr std::uint64_t kFrameParamBase = 0x0010'0000ull;

// A range of device (or registered host) memory the launch may touch, and where it lives here.
struct MemoryRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::byte* host = nullptr;  // the host address of `begin`
  bool writable = true;
};

// The ranges of one launch, sorted by address and disjoint.
class MemoryMap {
public:
  MemoryMap() = default;
  explicit MemoryMap(std::vector<MemoryRange> ranges) : ranges_(std::move(ranges)) {
    std::sort(ranges_.begin(), ranges_.end(),
              [](const MemoryRange& a, const MemoryRange& b) { return a.begin < b.begin; });
  }
  // The range holding [address, address + bytes), or nullptr.
  const MemoryRange* find(std::uint64_t address, std::uint64_t bytes) const {
    auto after = std::upper_bound(
        ranges_.begin(), ranges_.end(), address,
        [](std::uint64_t value, const MemoryRange& range) { return value < range.begin; });
    if (after == ranges_.begin()) return nullptr;
    const MemoryRange& range = *(after - 1);
    if (address >= range.end || bytes > range.end - address) return nullptr;
    return &range;
  }
  const std::vector<MemoryRange>& ranges() const { return ranges_; }

private:
  std::vector<MemoryRange> ranges_;
};

// Why a launch stopped early.
struct Fault {
  CUresult status = CUDA_SUCCESS;
  std::uint64_t address = 0;
  std::string what;  // "store of 4 bytes to global address 0x8" and the like
};

// One call frame of a warp: the registers of one function for the warp's 32 lanes.
struct Frame {
  const Function* function = nullptr;
  std::uint64_t* regs = nullptr;   // rows * 32
  std::uint32_t* preds = nullptr;  // one mask per predicate
  std::byte* params = nullptr;     // parameterStride() per lane, lane after lane
  std::uint32_t localBase = 0;     // where its .local variables start in each thread's memory
  Frame* caller = nullptr;
  std::uint32_t returnPc = 0;  // in the caller
  std::uint32_t callSite = 0;  // index in the caller's callSites
  std::uint32_t liveMask = 0;  // lanes inside this frame or deeper
  std::uint32_t depth = 0;
  std::vector<std::uint64_t> regStorage;
  std::vector<std::uint32_t> predStorage;
  std::vector<std::byte> paramStorage;
};

struct LaunchShared;  // per launch (ptx_interpreter.cpp)
struct BlockShared;   // per block

struct ExecContext {
  // The executing frame.
  std::uint64_t* regs = nullptr;
  std::uint32_t* preds = nullptr;
  std::byte* params = nullptr;
  std::uint32_t paramStride = 0;
  std::uint32_t localBase = 0;
  Frame* frame = nullptr;
  // The executing warp.
  std::uint32_t warpIndex = 0;
  std::uint32_t groupMask = 0;  // lanes of the running group (activemask)
  const std::uint32_t* tid[3] = {nullptr, nullptr, nullptr};  // the warp's %tid per lane
  // The block.
  std::byte* shared = nullptr;
  std::uint64_t sharedBytes = 0;
  std::byte* local = nullptr;  // thread t's memory at local + t * localStride
  std::uint32_t localStride = 0;
  std::uint32_t ctaid[3] = {0, 0, 0};
  std::uint32_t ntid[3] = {1, 1, 1};
  std::uint32_t nctaid[3] = {1, 1, 1};
  std::uint32_t warpsPerBlock = 1;
  std::uint32_t workerIndex = 0;  // %smid
  std::uint32_t workerCount = 1;  // %nsmid
  std::uint32_t dynamicSharedBytes = 0;
  std::uint64_t reservedSharedOffset =
      0;  // where the reserved region starts (kReservedSharedBytes)
  // The launch.
  const std::byte* kernelParams = nullptr;
  std::uint32_t kernelParamBytes = 0;
  const MemoryMap* memory = nullptr;
  const MemoryRange* lastRange = nullptr;  // a one-entry cache in front of memory->find
  // A cooperative launch's grid barrier workspace (global memory of the launch's own), or null.
  const MemoryRange* gridWorkspace = nullptr;
  Fault* fault = nullptr;
  LaunchShared* launch = nullptr;
  const Instruction* current = nullptr;  // for fault messages

  std::byte* threadLocal(std::uint32_t lane) {
    return local + static_cast<std::size_t>(warpIndex * kWarpSize + lane) * localStride;
  }

  std::uint64_t* row(std::uint32_t index) {
    return regs + static_cast<std::size_t>(index) * kWarpSize;
  }
};

// Records the first fault of a handler; always returns false.
bool raiseFault(ExecContext& context, CUresult status, std::uint64_t address, std::string what);

const char* spaceName(Space space);

// Host address of `bytes` at `address` in `space` for lane `lane`, or nullptr after recording a
// fault (illegal or misaligned address; a write to read-only memory).
std::byte* translateSlow(ExecContext& context, Space space, std::uint64_t address, unsigned bytes,
                         unsigned alignment, std::uint32_t lane, bool write);

inline std::byte* translate(ExecContext& context, Space space, std::uint64_t address,
                            unsigned bytes, unsigned alignment, std::uint32_t lane, bool write) {
  if ((address & (alignment - 1)) == 0) {
    if (space == Space::kGlobal ||
        (space == Space::kGeneric && (address < kSharedWindow || address >= kFunctionWindow))) {
      const MemoryRange* range = context.lastRange;
      if (range != nullptr && address >= range->begin && address < range->end &&
          bytes <= range->end - address && (!write || range->writable)) {
        return range->host + (address - range->begin);
      }
    } else if (space == Space::kShared) {
      if (address < context.sharedBytes && bytes <= context.sharedBytes - address) {
        return context.shared + address;
      }
    } else if (space == Space::kLocal) {
      if (address < context.localStride && bytes <= context.localStride - address) {
        return context.threadLocal(lane) + address;
      }
    }
  }
  return translateSlow(context, space, address, bytes, alignment, lane, write);
}

// A memory instruction's address is row op[4] plus `immediate`; this flag says the row holds a
// 32-bit address (a .shared window offset, say), whose upper bits are not part of it.
inline constexpr std::uint8_t kAddressBase32 = 1;

inline std::uint64_t addressOf(const Instruction& instruction, const std::uint64_t* base,
                               std::uint32_t lane) {
  const std::uint64_t value = (instruction.flags & kAddressBase32) != 0
                                  ? static_cast<std::uint32_t>(base[lane])
                                  : base[lane];
  return value + static_cast<std::uint64_t>(instruction.immediate);
}

// Runs `body(lane)` for every lane in `mask`.
template <typename Body>
inline void forLanes(std::uint32_t mask, Body&& body) {
  if (mask == 0xffffffffu) {
    for (std::uint32_t lane = 0; lane < kWarpSize; ++lane) body(lane);
  } else {
    while (mask != 0) {
      body(static_cast<std::uint32_t>(std::countr_zero(mask)));
      mask &= mask - 1;
    }
  }
}

// Runs `body(lane)` for every lane in `mask` until it returns false; returns whether all did.
template <typename Body>
inline bool forLanesUntil(std::uint32_t mask, Body&& body) {
  while (mask != 0) {
    if (!body(static_cast<std::uint32_t>(std::countr_zero(mask)))) return false;
    mask &= mask - 1;
  }
  return true;
}

// Register values as the types of instructions see them.
template <typename T>
inline T as(std::uint64_t bits) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<double>(bits);
  } else {
    return static_cast<T>(bits);
  }
}

template <typename T>
inline std::uint64_t bitsOf(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<std::uint64_t>(value);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(value));
  } else {
    return static_cast<std::uint64_t>(value);
  }
}

}  // namespace gpuproxy::server::ptx
