// The sim's device memory: freeing never waits for the engine, and memory the engine is working
// on is neither handed out again nor wiped until it is done.

#include "server/backend/sim/device_arena.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace gpuproxy::server::sim {
namespace {

constexpr CUdeviceptr kBase = 0x7f0000000000ull;
constexpr std::uint64_t kMiB = 1ull << 20;

// An allocation shared with another owner (interprocess memory) is among that owner's ranges
// until it is unshared or freed; nobody else's ranges ever hold it.
TEST(DeviceArena, ASharedAllocationIsTheOtherOwnersUntilUnsharedOrFreed) {
  auto arena = DeviceArena::create(kBase, 16 * kMiB);
  ASSERT_NE(arena, nullptr);
  auto first = arena->allocate(4096, 1);
  auto second = arena->allocate(4096, 1);
  ASSERT_TRUE(first.ok() && second.ok());
  auto rangesOf = [&](backend::AddressSpace owner) {
    std::uint64_t version = 0;
    std::vector<CUdeviceptr> starts;
    for (const ptx::MemoryRange& range : arena->access().rangesOf(owner, version)) {
      starts.push_back(range.begin);
    }
    return starts;
  };
  EXPECT_TRUE(rangesOf(2).empty());
  EXPECT_EQ(arena->share(first.value() + 256, 2), CUDA_ERROR_INVALID_VALUE);  // not a start
  ASSERT_EQ(arena->share(first.value(), 2), CUDA_SUCCESS);
  ASSERT_EQ(arena->share(second.value(), 2), CUDA_SUCCESS);
  EXPECT_EQ(rangesOf(2), (std::vector<CUdeviceptr>{first.value(), second.value()}));
  EXPECT_TRUE(rangesOf(3).empty());
  arena->unshare(first.value(), 2);
  EXPECT_EQ(rangesOf(2), std::vector<CUdeviceptr>{second.value()});
  EXPECT_EQ(arena->free(second.value()), CUDA_SUCCESS);
  EXPECT_TRUE(rangesOf(2).empty());
  EXPECT_EQ(rangesOf(1), std::vector<CUdeviceptr>{first.value()});
}

// Virtual memory management: reserved addresses lead nowhere until physical memory (an
// allocation of the daemon's own) is mapped behind them and an owner is given access; then they
// lead to that memory, for its kernels (rangesOf) and its copies (translate), one allocation at
// as many addresses as it is mapped at.
TEST(DeviceArena, MappedAddressesReachThePhysicalMemoryOnceAccessIsSet) {
  constexpr std::uint64_t kGranule = 2 * kMiB;
  const AddressWindow window{kBase + 64 * kMiB, kBase + 128 * kMiB};
  EXPECT_EQ(DeviceArena::create(kBase, 16 * kMiB, nullptr, {kBase + 8 * kMiB, kBase + 32 * kMiB}),
            nullptr);  // a window over the arena's own addresses
  auto arena = DeviceArena::create(kBase, 16 * kMiB, nullptr, window);
  ASSERT_NE(arena, nullptr);
  auto ranges = [&](backend::AddressSpace owner) {
    std::uint64_t version = 0;
    return arena->access().rangesOf(owner, version);
  };
  auto first = arena->reserveAddresses(3 * kGranule, kGranule);
  auto second = arena->reserveAddresses(kGranule, 16 * kMiB);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.value(), window.begin);
  EXPECT_EQ(second.value() % (16 * kMiB), 0u);
  EXPECT_GE(second.value(), first.value() + 3 * kGranule);
  EXPECT_EQ(arena->reserveAddresses(64 * kMiB, kGranule).code(), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(arena->reserveAddresses(kGranule, 3).code(), CUDA_ERROR_INVALID_VALUE);

  auto physical = arena->allocate(2 * kGranule);
  auto owned = arena->allocate(kGranule, 1);  // a client's allocation is no physical memory
  ASSERT_TRUE(physical.ok() && owned.ok());
  EXPECT_EQ(arena->map(first.value(), kGranule, owned.value(), 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(arena->map(first.value(), 3 * kGranule, physical.value(), 0),
            CUDA_ERROR_INVALID_VALUE);  // more than the memory
  EXPECT_EQ(arena->map(first.value() + 2 * kGranule, 2 * kGranule, physical.value(), 0),
            CUDA_ERROR_INVALID_VALUE);  // past the reservation
  ASSERT_EQ(arena->map(first.value(), 2 * kGranule, physical.value(), 0), CUDA_SUCCESS);
  EXPECT_EQ(arena->map(first.value() + kGranule, kGranule, physical.value(), 0),
            CUDA_ERROR_INVALID_VALUE);  // over a mapping
  ASSERT_EQ(arena->map(second.value(), kGranule, physical.value(), kGranule), CUDA_SUCCESS);
  EXPECT_EQ(arena->free(physical.value()), CUDA_ERROR_INVALID_VALUE);  // still mapped

  // Mapped, but nobody's yet.
  EXPECT_EQ(arena->access().translate(first.value(), 4), nullptr);
  EXPECT_EQ(ranges(1).size(), 1u);  // only its own allocation
  EXPECT_EQ(arena->setAccess(first.value(), kGranule, 1, true), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(arena->setAccess(first.value(), 2 * kGranule, 1, true), CUDA_SUCCESS);
  ASSERT_EQ(arena->setAccess(second.value(), kGranule, 1, true), CUDA_SUCCESS);
  EXPECT_EQ(ranges(1).size(), 3u);  // the allocation and both mappings
  EXPECT_TRUE(ranges(2).empty());
  {
    DeviceArena::Access access = arena->access();
    std::byte* front = access.translate(first.value() + kGranule, kGranule);
    std::byte* alias = access.translate(second.value(), kGranule);
    ASSERT_NE(front, nullptr);
    EXPECT_EQ(front, alias);  // the second granule of the memory, at both addresses
    EXPECT_EQ(access.translate(first.value() + kGranule, kGranule + 1), nullptr);
    EXPECT_EQ(access.translate(first.value() + 2 * kGranule, 4), nullptr);  // reserved only
  }
  ASSERT_EQ(arena->setAccess(second.value(), kGranule, 1, false), CUDA_SUCCESS);
  EXPECT_EQ(arena->access().translate(second.value(), 4), nullptr);

  EXPECT_EQ(arena->freeAddresses(first.value(), 3 * kGranule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(arena->unmap(first.value(), kGranule), CUDA_ERROR_INVALID_VALUE);  // part of one
  ASSERT_EQ(arena->unmap(first.value(), 2 * kGranule), CUDA_SUCCESS);
  ASSERT_EQ(arena->unmap(second.value(), kGranule), CUDA_SUCCESS);
  EXPECT_EQ(ranges(1).size(), 1u);
  EXPECT_EQ(arena->free(physical.value()), CUDA_SUCCESS);
  EXPECT_EQ(arena->freeAddresses(first.value(), kGranule), CUDA_ERROR_INVALID_VALUE);  // size
  EXPECT_EQ(arena->freeAddresses(first.value(), 3 * kGranule), CUDA_SUCCESS);
  EXPECT_EQ(arena->freeAddresses(second.value(), kGranule), CUDA_SUCCESS);
  // The window is whole again.
  auto whole = arena->reserveAddresses(64 * kMiB, kGranule);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole.value(), window.begin);
}

TEST(DeviceArena, MemoryFreedDuringAnAccessIsKeptUntilTheAccessEnds) {
  auto arena = DeviceArena::create(kBase, 4 * kMiB);
  ASSERT_TRUE(arena);
  auto first = arena->allocate(kMiB);
  ASSERT_TRUE(first.ok());
  {
    DeviceArena::Access access = arena->access();
    std::byte* bytes = access.translate(first.value(), kMiB);
    ASSERT_NE(bytes, nullptr);
    std::memset(bytes, 0x5a, kMiB);
  }
  {
    // The engine is in the middle of a copy out of `first` when its owner frees it: the free
    // returns (on this same thread, so it cannot have waited for the access) ...
    DeviceArena::Access access = arena->access();
    std::byte* bytes = access.translate(first.value(), kMiB);
    ASSERT_NE(bytes, nullptr);
    EXPECT_EQ(arena->free(first.value()), CUDA_SUCCESS);
    EXPECT_EQ(arena->allocatedBytes(), 0u);
    // ... but nobody gets that memory meanwhile, and what the engine reads is still there.
    auto second = arena->allocate(kMiB);
    ASSERT_TRUE(second.ok());
    EXPECT_NE(second.value(), first.value());
    EXPECT_EQ(bytes[0], std::byte{0x5a});
    EXPECT_EQ(bytes[kMiB - 1], std::byte{0x5a});
    EXPECT_EQ(arena->free(second.value()), CUDA_SUCCESS);
    EXPECT_EQ(access.translate(first.value(), 1), nullptr);  // no longer an allocation
  }
  // Once the engine is done the memory is free again: the whole capacity fits in one piece.
  auto whole = arena->allocate(4 * kMiB);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole.value(), kBase);
  DeviceArena::Access access = arena->access();
  std::byte* bytes = access.translate(whole.value(), kMiB);
  ASSERT_NE(bytes, nullptr);
  EXPECT_EQ(bytes[0], std::byte{0});  // the freed pages were given back
}

TEST(DeviceArena, AnAllocationThatOnlyFitsInMemoryFreedDuringAnAccessWaitsForIt) {
  auto arena = DeviceArena::create(kBase, 2 * kMiB);
  ASSERT_TRUE(arena);
  auto first = arena->allocate(2 * kMiB);
  ASSERT_TRUE(first.ok());
  auto access = std::make_unique<DeviceArena::Access>(arena->access());
  ASSERT_EQ(arena->free(first.value()), CUDA_SUCCESS);
  std::thread engine([&access] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    access.reset();
  });
  // Not CUDA_ERROR_OUT_OF_MEMORY: the memory is free, only not yet released by the engine.
  auto again = arena->allocate(2 * kMiB);
  engine.join();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value(), kBase);
}

TEST(DeviceArena, FreeingKeepsWhatANeighbourSharingAPageHolds) {
  // a, b and c fill the arena exactly; b shares its first page with a and its last with c.
  constexpr std::uint64_t kSmall = 3072;
  constexpr std::uint64_t kCapacity = 4 * kMiB;
  auto arena = DeviceArena::create(kBase, kCapacity);
  ASSERT_TRUE(arena);
  auto a = arena->allocate(kSmall);
  auto b = arena->allocate(kSmall);
  auto c = arena->allocate(kCapacity - 2 * kSmall);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  {
    DeviceArena::Access access = arena->access();
    std::memset(access.translate(a.value(), kSmall), 0x11, kSmall);
    std::memset(access.translate(b.value(), kSmall), 0x22, kSmall);
    std::memset(access.translate(c.value(), kCapacity - 2 * kSmall), 0x33, kCapacity - 2 * kSmall);
  }
  auto bIsIntact = [&] {
    DeviceArena::Access access = arena->access();
    const std::byte* bytes = access.translate(b.value(), kSmall);
    if (bytes == nullptr) return false;
    for (std::size_t i = 0; i < kSmall; ++i) {
      if (bytes[i] != std::byte{0x22}) return false;
    }
    return true;
  };
  // Each allocation below fits only once the freed range is back, pages given up and all.
  ASSERT_EQ(arena->free(a.value()), CUDA_SUCCESS);
  auto again = arena->allocate(kSmall);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value(), a.value());
  EXPECT_TRUE(bIsIntact());
  ASSERT_EQ(arena->free(c.value()), CUDA_SUCCESS);
  auto rest = arena->allocate(kCapacity - 2 * kSmall);
  ASSERT_TRUE(rest.ok());
  EXPECT_TRUE(bIsIntact());
}

TEST(DeviceArena, UnregisteringHostMemoryWaitsForTheAccessUsingIt) {
  auto arena = DeviceArena::create(kBase, kMiB);
  ASSERT_TRUE(arena);
  std::vector<std::byte> host(4096);
  ASSERT_EQ(arena->registerHost(host.data(), host.size()), CUDA_SUCCESS);
  auto access = std::make_unique<DeviceArena::Access>(arena->access());
  auto address = reinterpret_cast<CUdeviceptr>(host.data());
  ASSERT_EQ(access->translate(address, host.size()), host.data());
  std::atomic<bool> released{false};
  std::thread engine([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    released = true;
    access.reset();
  });
  EXPECT_EQ(arena->unregisterHost(host.data()), CUDA_SUCCESS);
  EXPECT_TRUE(released.load());
  engine.join();
}

}  // namespace
}  // namespace gpuproxy::server::sim
