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
