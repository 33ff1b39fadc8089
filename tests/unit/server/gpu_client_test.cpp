// A client's state on one GPU, driven directly on the sim backend: handle checks, exact accounting,
// per-context cleanup, and the waits CUDA promises (cuMemFree after queued work).
#include "server/gpu/gpu_client.hpp"

#include "printf_hello_ptx.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/gpu_shard.hpp"
#include "test_kernels_ptx.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <cstring>
#include <future>
#include <memory>
#include <vector>

namespace gpuproxy::server {
namespace {

class GpuClientTest : public ::testing::Test {
protected:
  GpuClientTest()
      : io_(std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo())),
        backend_(sim::newSimBackend(sim::SimOptions{1, 1ull << 30})),
        shard_(0, std::move(backend_->openDevice(0)).value(), io_->provider->getTimer()) {}

  std::unique_ptr<GpuClient> newClient(pid_t pid = 1234) {
    auto stats = std::make_shared<ClientStats>();
    stats->identity.pid = pid;
    stats->tenant = tenant_;
    // Each client its own address space, as each connection has in the daemon.
    stats->addressSpace = stats_.size() + 1;
    stats_.push_back(stats);
    return shard_.openClient(stats);
  }

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(io_->waitScope);
  }

  // Turns the event loop (completions arrive on it) until `condition` holds, for up to 10 s.
  template <typename Condition>
  bool soon(Condition&& condition) {
    for (int turn = 0; turn < 10000; ++turn) {
      if (condition()) return true;
      io_->provider->getTimer().afterDelay(kj::MILLISECONDS).wait(io_->waitScope);
    }
    return condition();
  }

  Handle launchSpin(GpuClient& client, Handle context, Handle stream, std::uint64_t ns) {
    auto module = wait(client.loadModule(context, bytes(testing::kTestKernelsPtx)));
    EXPECT_TRUE(module.ok());
    auto spin = client.function(module.value(), "spin");
    EXPECT_TRUE(spin.ok());
    EXPECT_EQ(client.launchKernel(context, spin.value().handle, {{1, 1, 1}, {1, 1, 1}, 0}, stream,
                                  std::as_bytes(std::span(&ns, 1))),
              CUDA_SUCCESS);
    return module.value();
  }

  // Runs a kernel that faults in `context` of `culprit`: the GPU's shared context is poisoned
  // (a sticky CUDA_ERROR_ILLEGAL_ADDRESS), as its synchronisation says.
  void poisonTheGpu(GpuClient& culprit, Handle context) {
    auto module = wait(culprit.loadModule(context, bytes(testing::kTestKernelsPtx)));
    ASSERT_TRUE(module.ok());
    auto trap = culprit.function(module.value(), "trap");
    ASSERT_EQ(culprit.launchKernel(context, trap.value().handle, {{1, 1, 1}, {1, 1, 1}, 0}, 0, {}),
              CUDA_SUCCESS);
    EXPECT_EQ(wait(culprit.synchronizeContext(context)), CUDA_ERROR_ILLEGAL_ADDRESS);
  }

  static std::vector<std::byte> bytes(const char* text) {
    const auto* begin = reinterpret_cast<const std::byte*>(text);
    return {begin, begin + std::strlen(text) + 1};
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_;
  std::unique_ptr<backend::Backend> backend_;
  GpuShard shard_;
  std::vector<std::shared_ptr<ClientStats>> stats_;
  std::shared_ptr<Tenant> tenant_ =
      std::make_shared<Tenant>(1, TenantDefinition{"test", "/unused", TenantLimits{}});
};

// A client is charged what its allocations occupy on the device: the sim's arena hands out whole
// 256-byte granules, so 1000 bytes take 1024 and 5000 take 5120.
TEST_F(GpuClientTest, AccountsEveryByteAndGivesItBackWhenTheContextGoes) {
  auto client = newClient();
  auto context = client->createContext(0);
  ASSERT_TRUE(context.ok());
  auto a = wait(client->allocate(context.value(), 1000));
  auto b = wait(client->allocate(context.value(), 5000));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(shard_.memoryUsed(), 1024u + 5120u);
  EXPECT_EQ(stats_[0]->memoryUsed, 1024u + 5120u);
  EXPECT_EQ(tenant_->memoryUsed(), 1024u + 5120u);
  EXPECT_EQ(wait(client->free(a.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 5120u);
  EXPECT_EQ(wait(client->destroyContext(context.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(stats_[0]->memoryUsed, 0u);
  // Everything of the destroyed context is gone with it.
  EXPECT_EQ(wait(client->free(b.value())), CUDA_ERROR_INVALID_VALUE);
}

// cuMemAlloc and cuMemFree run on the GPU's blocking-call thread (they may wait for the driver);
// memory allocated for a caller that stopped waiting is freed again, and nothing stays charged.
TEST_F(GpuClientTest, AllocationsAndFreesRunOffTheOwnerThread) {
  auto client = newClient();
  auto context = client->createContext(0);
  ASSERT_TRUE(context.ok());
  const std::uint64_t calls = shard_.blockingCalls().completed;
  const std::uint64_t deviceFree = shard_.memoryInfo().free;
  auto pointer = wait(client->allocate(context.value(), 4096));
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(shard_.blockingCalls().completed, calls + 1);
  EXPECT_EQ(wait(client->free(pointer.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.blockingCalls().completed, calls + 2);
  { auto abandoned = client->allocate(context.value(), 1 << 20); }
  // The call is counted when it ends; when its answer reaches the shard, the memory is freed
  // again, there too.
  EXPECT_TRUE(soon([&] {
    return shard_.blockingCalls().completed == calls + 4 && shard_.memoryInfo().free == deviceFree;
  }));
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(stats_[0]->memoryUsed, 0u);
}

TEST_F(GpuClientTest, DestroyingTheClientFreesWhatItHeld) {
  auto client = newClient();
  auto context = client->createContext(0);
  ASSERT_TRUE(wait(client->allocate(context.value(), 1 << 20)).ok());
  ASSERT_TRUE(client->createStream(context.value(), 0, 0).ok());
  EXPECT_EQ(shard_.clientCount(), 1u);
  wait(client->drain());
  client.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(shard_.clientCount(), 0u);
}

// What a gone client held is the tenant's again at once, and freed on the GPU's blocking-call
// thread (cuMemFree may wait for the device): after every allocation asked for before it, before
// every one asked for after it, so that memory the ledger calls free is free on the device too
// by the time a later allocation reaches it.
TEST_F(GpuClientTest, AGoneClientsMemoryIsFreedOffTheOwnerThreadBeforeAnyLaterAllocation) {
  constexpr std::uint64_t kMostOfTheDevice = 768ull << 20;  // of 1 GiB
  auto client = newClient(1);
  auto context = client->createContext(0);
  ASSERT_TRUE(wait(client->allocate(context.value(), kMostOfTheDevice)).ok());
  wait(client->drain());
  const std::uint64_t calls = shard_.blockingCalls().completed;
  client.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(tenant_->memoryUsed(), 0u);

  auto next = newClient(2);
  auto nextContext = next->createContext(0);
  auto again = wait(next->allocate(nextContext.value(), kMostOfTheDevice));
  EXPECT_TRUE(again.ok()) << again.code();
  EXPECT_EQ(shard_.blockingCalls().completed, calls + 2);  // the free, then the allocation
  EXPECT_EQ(shard_.memoryUsed(), kMostOfTheDevice);
}

// Physical memory (cuMemCreate) is charged like an allocation, against the tenant's limit, and
// comes back once it is released and unmapped, or with the client, never with a context (as
// cuCtxDestroy leaves it); the addresses mapped are the client's to copy to only once their access
// is set, and never another client's.
TEST_F(GpuClientTest, VirtualMemoryIsChargedCheckedAndOutlivesItsContext) {
  constexpr std::uint64_t kGranule = protocol::kVirtualMemoryGranularity;
  TenantLimits limits;
  limits.memoryLimit = 5 * kGranule;
  tenant_->setLimits(limits);
  auto client = newClient(1);
  auto other = newClient(2);
  auto context = client->createContext(0);
  auto otherContext = other->createContext(0);
  auto physical = wait(client->createPhysicalMemory(4 * kGranule));
  ASSERT_TRUE(physical.ok());
  EXPECT_EQ(shard_.memoryUsed(), 4 * kGranule);
  EXPECT_EQ(wait(client->createPhysicalMemory(2 * kGranule)).code(),
            CUDA_ERROR_OUT_OF_MEMORY);  // beyond the tenant's limit
  EXPECT_EQ(wait(client->createPhysicalMemory(kGranule + 1)).code(), CUDA_ERROR_INVALID_VALUE);

  auto reserved = client->reserveAddresses(context.value(), 4 * kGranule, 0);
  ASSERT_TRUE(reserved.ok());
  const CUdeviceptr address = reserved.value();
  ASSERT_EQ(client->mapMemory(address, 4 * kGranule, 0, physical.value()), CUDA_SUCCESS);
  // Another client names neither the memory nor the addresses.
  EXPECT_EQ(other->mapMemory(address, 4 * kGranule, 0, physical.value()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(other->setMemoryAccess(address, 4 * kGranule, true), CUDA_ERROR_INVALID_VALUE);
  const std::vector<std::byte> bytes(64, std::byte{0x42});
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, address, bytes), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(client->setMemoryAccess(address, 4 * kGranule, true), CUDA_SUCCESS);
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, address, bytes), CUDA_SUCCESS);
  EXPECT_EQ(other->copyHostToDevice(otherContext.value(), 0, address, bytes),
            CUDA_ERROR_INVALID_VALUE);
  auto back = wait(client->copyDeviceToHost(context.value(), 0, address, bytes.size()));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value(), bytes);

  // Released while mapped: still charged, still there.
  EXPECT_EQ(client->releasePhysicalMemory(physical.value()), CUDA_SUCCESS);
  EXPECT_EQ(client->releasePhysicalMemory(physical.value()), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(shard_.memoryUsed(), 4 * kGranule);
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, address, bytes), CUDA_SUCCESS);
  // Unmapped: given back.
  EXPECT_EQ(wait(client->unmapMemory(address, 4 * kGranule)), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, address, bytes), CUDA_ERROR_INVALID_VALUE);

  // The context going takes none of it: the memory stays mapped and charged, reachable from the
  // client's next context, until it is unmapped and the addresses freed.
  auto again = wait(client->createPhysicalMemory(2 * kGranule));
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(client->mapMemory(address, 2 * kGranule, 0, again.value()), CUDA_SUCCESS);
  ASSERT_EQ(client->setMemoryAccess(address, 2 * kGranule, true), CUDA_SUCCESS);
  ASSERT_EQ(client->releasePhysicalMemory(again.value()), CUDA_SUCCESS);
  ASSERT_EQ(client->copyHostToDevice(context.value(), 0, address, bytes), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 2 * kGranule);
  EXPECT_EQ(wait(client->destroyContext(context.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 2 * kGranule);
  EXPECT_TRUE(client->reservesAddress(address));
  EXPECT_TRUE(client->holdsDeviceState());
  auto next = client->createContext(0);
  auto kept = wait(client->copyDeviceToHost(next.value(), 0, address, bytes.size()));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept.value(), bytes);
  EXPECT_EQ(wait(client->destroyContext(next.value())), CUDA_SUCCESS);
  EXPECT_EQ(wait(client->unmapMemory(address, 2 * kGranule)), CUDA_SUCCESS);
  EXPECT_EQ(client->freeAddresses(address, 4 * kGranule), CUDA_SUCCESS);
  EXPECT_FALSE(client->holdsDeviceState());
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);

  // What the client still holds goes with it.
  auto last = wait(other->createPhysicalMemory(kGranule * 2));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(shard_.memoryUsed(), 2 * kGranule);
  other.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
}

// Physical memory exported to a shareable handle (cuMemExportToShareableHandle) imports, as one
// memory, into any client of the same tenant on the GPU, the maker itself included, and into no
// other tenant's; it stays its maker's charge, and goes back to the device only when the last
// client holding or mapping it lets go, whichever goes first.
TEST_F(GpuClientTest, ExportedPhysicalMemoryIsOneMemoryForTheTenantsClients) {
  constexpr std::uint64_t kGranule = protocol::kVirtualMemoryGranularity;
  auto maker = newClient(1);
  auto importer = newClient(2);
  auto made = wait(maker->createPhysicalMemory(kGranule));
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(maker->exportPhysicalMemory(made.value() + 1).code(), CUDA_ERROR_INVALID_VALUE);
  auto token = maker->exportPhysicalMemory(made.value());
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(maker->exportPhysicalMemory(made.value()).value(), token.value());
  IpcToken madeUp = token.value();
  madeUp[3] ^= std::byte{1};
  EXPECT_EQ(importer->importPhysicalMemory(madeUp).code(), CUDA_ERROR_INVALID_VALUE);
  auto stranger = std::make_shared<ClientStats>();
  stranger->tenant = std::make_shared<Tenant>(2, TenantDefinition{"other", "/unused", {}});
  stranger->addressSpace = 99;
  auto outsider = shard_.openClient(stranger);
  EXPECT_EQ(outsider->importPhysicalMemory(token.value()).code(), CUDA_ERROR_INVALID_VALUE);
  auto again = maker->importPhysicalMemory(token.value());  // a process may import its own
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again.value().handle, made.value());
  EXPECT_EQ(maker->releasePhysicalMemory(again.value().handle), CUDA_SUCCESS);

  auto imported = importer->importPhysicalMemory(token.value());
  ASSERT_TRUE(imported.ok());
  EXPECT_EQ(imported.value().bytes, kGranule);
  EXPECT_EQ(shard_.memoryUsed(), kGranule);  // one memory, charged once
  EXPECT_EQ(stats_[1]->memoryUsed, 0u);      // to its maker

  // Mapped by each at addresses of its own: what one writes the other reads.
  auto makerContext = maker->createContext(0);
  auto importerContext = importer->createContext(0);
  auto makerAddress = maker->reserveAddresses(makerContext.value(), kGranule, 0);
  auto importerAddress = importer->reserveAddresses(importerContext.value(), kGranule, 0);
  ASSERT_EQ(maker->mapMemory(makerAddress.value(), kGranule, 0, made.value()), CUDA_SUCCESS);
  ASSERT_EQ(importer->mapMemory(importerAddress.value(), kGranule, 0, imported.value().handle),
            CUDA_SUCCESS);
  ASSERT_EQ(maker->setMemoryAccess(makerAddress.value(), kGranule, true), CUDA_SUCCESS);
  ASSERT_EQ(importer->setMemoryAccess(importerAddress.value(), kGranule, true), CUDA_SUCCESS);
  const std::vector<std::byte> bytes(256, std::byte{0x5a});
  ASSERT_EQ(importer->copyHostToDevice(importerContext.value(), 0, importerAddress.value(), bytes),
            CUDA_SUCCESS);
  EXPECT_EQ(wait(importer->synchronizeContext(importerContext.value())), CUDA_SUCCESS);
  auto seen =
      wait(maker->copyDeviceToHost(makerContext.value(), 0, makerAddress.value(), bytes.size()));
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen.value(), bytes);
  // The importer's handle names the memory for it alone.
  EXPECT_EQ(outsider->mapMemory(importerAddress.value(), kGranule, 0, imported.value().handle),
            CUDA_ERROR_INVALID_VALUE);

  // The maker goes: the memory stays, still charged to it, while the importer maps it.
  EXPECT_EQ(importer->releasePhysicalMemory(imported.value().handle), CUDA_SUCCESS);
  wait(maker->drain());
  maker.reset();
  EXPECT_EQ(shard_.memoryUsed(), kGranule);
  EXPECT_EQ(tenant_->memoryUsed(0), kGranule);
  auto still = wait(importer->copyDeviceToHost(importerContext.value(), 0, importerAddress.value(),
                                               bytes.size()));
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still.value(), bytes);
  // Its last holder lets go: back to the device, and its token opens nothing more.
  EXPECT_EQ(wait(importer->unmapMemory(importerAddress.value(), kGranule)), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
  EXPECT_EQ(importer->importPhysicalMemory(token.value()).code(), CUDA_ERROR_INVALID_VALUE);
}

// A client that goes without synchronising after its kernels printed: its output goes with it,
// or it would stay in the daemon for good (its address space is never used again).
TEST_F(GpuClientTest, WhatAGoneClientsKernelsPrintedGoesWithIt) {
  auto client = newClient();
  const backend::AddressSpace space = stats_.back()->addressSpace;
  auto context = client->createContext(0);
  ASSERT_TRUE(context.ok());
  auto module = wait(client->loadModule(context.value(), bytes(testing::kPrintfHelloPtx)));
  ASSERT_TRUE(module.ok());
  auto hello = client->function(module.value(), "hello");
  ASSERT_TRUE(hello.ok());
  const int launchNumber = 1;
  ASSERT_EQ(client->launchKernel(context.value(), hello.value().handle, {{1, 1, 1}, {2, 1, 1}, 0},
                                 0, std::as_bytes(std::span(&launchNumber, 1))),
            CUDA_SUCCESS);
  wait(client->drain());
  client.reset();
  EXPECT_EQ(shard_.device().takeDeviceOutput(space), "");
}

// A client's kernels' printf output is gathered from the device before a synchronisation is
// answered and kept, on the client's GPU, until the client takes it; taken once.
TEST_F(GpuClientTest, WhatTheKernelsPrintedWaitsOnItsGpuUntilTaken) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto module = wait(client->loadModule(context.value(), bytes(testing::kPrintfHelloPtx)));
  auto hello = client->function(module.value(), "hello");
  const int launchNumber = 7;
  ASSERT_EQ(client->launchKernel(context.value(), hello.value().handle, {{1, 1, 1}, {4, 1, 1}, 0},
                                 0, std::as_bytes(std::span(&launchNumber, 1))),
            CUDA_SUCCESS);
  EXPECT_EQ(wait(client->synchronizeContext(context.value())), CUDA_SUCCESS);
  const std::size_t waiting = client->collectDeviceOutput();
  EXPECT_GT(waiting, 0u);
  EXPECT_EQ(client->collectDeviceOutput(), waiting);  // nothing new on the device
  GpuClient::DeviceOutput output = client->takeDeviceOutput();
  EXPECT_EQ(output.text.size(), waiting);
  EXPECT_NE(output.text.find("launch 7, block 0, thread 3"), std::string::npos);
  EXPECT_EQ(output.lostBytes, 0u);
  EXPECT_EQ(client->takeDeviceOutput().text, "");
}

// As a GPU's circular printf buffer: the newest output stays, whole lines where it can.
TEST(KeepNewestOutput, DropsTheOldestWholeLines) {
  std::string output = "a\nbb\nccc\n";
  EXPECT_EQ(keepNewestOutput(output, 5), 5u);
  EXPECT_EQ(output, "ccc\n");
  EXPECT_EQ(keepNewestOutput(output, 4), 0u);
  std::string oneLine = "0123456789";
  EXPECT_EQ(keepNewestOutput(oneLine, 4), 6u);  // no line to end at: the newest bytes
  EXPECT_EQ(oneLine, "6789");
}

// A host function (cuLaunchHostFunc) holds its stream on the GPU, by the client's token, until
// the client says it returned; a token holds one stream at a time, and a gone client's holds go.
TEST_F(GpuClientTest, AHostFunctionHoldsItsStreamUntilItReturns) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto stream = client->createStream(context.value(), CU_STREAM_NON_BLOCKING, 0);
  GpuClient::StreamHold hold =
      client->holdStreamForHostFunction(context.value(), stream.value(), 7);
  ASSERT_EQ(hold.result, CUDA_SUCCESS);
  EXPECT_EQ(client->holdStreamForHostFunction(context.value(), stream.value(), 7).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(client->holdStreamForHostFunction(context.value(), 0xdead, 8).result,
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(client->hostFunctionsPending(), 1u);
  EXPECT_EQ(wait(std::move(hold.reached)), CUDA_SUCCESS);  // nothing before it on the stream
  auto after = client->createEvent(context.value(), CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(client->recordEvent(context.value(), after.value(), stream.value()), CUDA_SUCCESS);
  // Time enough for the record to run, were it not held.
  io_->provider->getTimer().afterDelay(50 * kj::MILLISECONDS).wait(io_->waitScope);
  EXPECT_EQ(client->queryEvent(after.value()), CUDA_ERROR_NOT_READY);
  EXPECT_FALSE(client->hostFunctionReturned(8));
  EXPECT_TRUE(client->hostFunctionReturned(7));
  EXPECT_FALSE(client->hostFunctionReturned(7));  // once
  EXPECT_EQ(wait(client->synchronizeEvent(after.value())), CUDA_SUCCESS);
  EXPECT_EQ(client->hostFunctionsPending(), 0u);

  ASSERT_EQ(client->holdStreamForHostFunction(context.value(), stream.value(), 9).result,
            CUDA_SUCCESS);
  client->abandon();
  EXPECT_EQ(client->hostFunctionsPending(), 0u);
  EXPECT_FALSE(client->hostFunctionReturned(9));
}

// A stream waiting for another GPU's event is held on its own GPU under a name the GPU gives,
// until whoever saw the event's record done lets it go by that name; the names are not the
// client's host-function tokens, so a client's token can never let such a stream go.
TEST_F(GpuClientTest, AStreamWaitingForAnotherGpusEventIsHeldUntilLetGoByItsName) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto stream = client->createStream(context.value(), CU_STREAM_NON_BLOCKING, 0);
  EXPECT_EQ(client->holdStreamForAnotherGpu(context.value(), 0xdead).result,
            CUDA_ERROR_INVALID_HANDLE);
  const GpuClient::HoldForAnotherGpu held =
      client->holdStreamForAnotherGpu(context.value(), stream.value());
  ASSERT_EQ(held.result, CUDA_SUCCESS);
  auto after = client->createEvent(context.value(), CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(client->recordEvent(context.value(), after.value(), stream.value()), CUDA_SUCCESS);
  // Time enough for the record to run, were it not held.
  io_->provider->getTimer().afterDelay(50 * kj::MILLISECONDS).wait(io_->waitScope);
  EXPECT_EQ(client->queryEvent(after.value()), CUDA_ERROR_NOT_READY);
  EXPECT_FALSE(client->hostFunctionReturned(held.hold)) << "a client's token let it go";
  client->anotherGpusEventDone(held.hold + 1);  // no such hold: nothing
  EXPECT_EQ(client->queryEvent(after.value()), CUDA_ERROR_NOT_READY);
  client->anotherGpusEventDone(held.hold);
  EXPECT_EQ(wait(client->synchronizeEvent(after.value())), CUDA_SUCCESS);
  client->anotherGpusEventDone(held.hold);  // once: nothing more

  // A gone client's holds go with it, and letting one go later finds nothing.
  const GpuClient::HoldForAnotherGpu dropped =
      client->holdStreamForAnotherGpu(context.value(), stream.value());
  ASSERT_EQ(dropped.result, CUDA_SUCCESS);
  EXPECT_NE(dropped.hold, held.hold);
  client->abandon();
  client->anotherGpusEventDone(dropped.hold);
}

TEST_F(GpuClientTest, HandlesOfTheWrongKindOrOfAnotherClientAreRejected) {
  auto alice = newClient(1);
  auto bob = newClient(2);
  auto aliceContext = alice->createContext(0);
  auto bobContext = bob->createContext(0);
  auto aliceStream = alice->createStream(aliceContext.value(), 0, 0);
  auto aliceEvent = alice->createEvent(aliceContext.value(), 0);
  auto aliceMemory = wait(alice->allocate(aliceContext.value(), 4096));
  ASSERT_TRUE(aliceStream.ok() && aliceEvent.ok() && aliceMemory.ok());

  // Bob cannot use Alice's stream, event or memory, even on the same GPU.
  EXPECT_EQ(bob->queryStream(bobContext.value(), aliceStream.value()), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(bob->queryEvent(aliceEvent.value()), CUDA_ERROR_INVALID_HANDLE);
  std::vector<std::byte> data(64);
  EXPECT_EQ(bob->copyHostToDevice(bobContext.value(), 0, aliceMemory.value(), data),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(wait(bob->free(aliceMemory.value())), CUDA_ERROR_INVALID_VALUE);
  // Alice cannot pass an event where a stream belongs.
  EXPECT_EQ(alice->queryStream(aliceContext.value(), aliceEvent.value()),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(alice->destroyStream(aliceEvent.value()), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(GpuClientTest, CopiesMustStayInsideOneOfTheClientsAllocations) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto pointer = wait(client->allocate(context.value(), 1024));
  std::vector<std::byte> data(1024, std::byte{7});
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, pointer.value(), data), CUDA_SUCCESS);
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, pointer.value() + 1, data),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(client->copyHostToDevice(context.value(), 0, pointer.value() - 1, data),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(client->enqueue(context.value(), 0, backend::Memset{pointer.value() + 2, 0, 4, 4}),
            CUDA_ERROR_INVALID_VALUE);  // misaligned 32-bit memset
  auto back = wait(client->copyDeviceToHost(context.value(), 0, pointer.value(), 1024));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value(), data);
}

// Host memory registered with the GPU for a client (its pinned or managed memory) is reached at
// its own address: a memset may name it as device memory, for that client only, and only until
// its unregistration starts.
TEST_F(GpuClientTest, RegisteredHostMemoryIsDeviceMemoryToItsOwnerOnly) {
  auto owner = newClient();
  auto other = newClient(4321);
  auto ownerContext = owner->createContext(0);
  auto otherContext = other->createContext(0);
  std::vector<std::uint32_t> host(1024, 0);
  const auto address = reinterpret_cast<CUdeviceptr>(host.data());
  const std::size_t bytes = host.size() * sizeof(std::uint32_t);
  const backend::Memset fill{address, 0xabcdu, 4, host.size()};
  EXPECT_EQ(owner->enqueue(ownerContext.value(), 0, fill), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(wait(shard_.registerHostMemory(host.data(), bytes, stats_[0]->addressSpace)),
            CUDA_SUCCESS);
  EXPECT_EQ(owner->enqueue(ownerContext.value(), 0, fill), CUDA_SUCCESS);
  EXPECT_EQ(other->enqueue(otherContext.value(), 0, fill), CUDA_ERROR_INVALID_VALUE);
  const backend::Memset pastTheEnd{address + 4, 0, 4, host.size()};
  EXPECT_EQ(owner->enqueue(ownerContext.value(), 0, pastTheEnd), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(wait(owner->synchronizeContext(ownerContext.value())), CUDA_SUCCESS);
  EXPECT_EQ(host.front(), 0xabcdu);
  EXPECT_EQ(host.back(), 0xabcdu);

  auto unregistered = shard_.unregisterHostMemory(host.data());
  EXPECT_EQ(owner->enqueue(ownerContext.value(), 0, fill), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(wait(kj::mv(unregistered)), CUDA_SUCCESS);
}

// Interprocess handles (cuIpc*): another client of the same tenant opens an exported allocation
// and its kernels and copies reach it; the exporter itself and another tenant's client cannot;
// and memory the exporter frees while it is open elsewhere stays until the last mapping closes.
TEST_F(GpuClientTest, AnExportedAllocationOpensForTheTenantsOtherClientsOnly) {
  auto exporter = newClient();
  auto importer = newClient(4321);
  auto exporterContext = exporter->createContext(0);
  auto importerContext = importer->createContext(0);
  constexpr std::uint64_t kWords = 256;
  auto memory = wait(exporter->allocate(exporterContext.value(), kWords * 4));
  ASSERT_TRUE(memory.ok());
  EXPECT_EQ(exporter->exportMemory(memory.value() - 1).code(), CUDA_ERROR_INVALID_VALUE);
  auto token = exporter->exportMemory(memory.value() + 100);  // inside: the whole allocation
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(exporter->exportMemory(memory.value()).value(), token.value());
  IpcToken madeUp = token.value();
  madeUp[0] ^= std::byte{1};

  EXPECT_EQ(exporter->openMemory(exporterContext.value(), token.value()).code(),
            CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(importer->openMemory(importerContext.value(), madeUp).code(), CUDA_ERROR_INVALID_VALUE);
  // Not even a memset reaches it before the open.
  const backend::Memset memset{memory.value(), 0, 4, kWords};
  EXPECT_EQ(importer->enqueue(importerContext.value(), 0, memset), CUDA_ERROR_INVALID_VALUE);
  auto stranger = std::make_shared<ClientStats>();
  stranger->tenant = std::make_shared<Tenant>(2, TenantDefinition{"other", "/unused", {}});
  stranger->addressSpace = 99;
  auto outsider = shard_.openClient(stranger);
  auto outsiderContext = outsider->createContext(0);
  EXPECT_EQ(outsider->openMemory(outsiderContext.value(), token.value()).code(),
            CUDA_ERROR_INVALID_VALUE);

  auto opened = importer->openMemory(importerContext.value(), token.value());
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened.value().base, memory.value());
  EXPECT_EQ(opened.value().bytes, kWords * 4);
  EXPECT_EQ(importer->openMemory(importerContext.value(), token.value()).value().base,
            memory.value());  // a second reference
  // The importer's kernel writes the exporter's memory (the sim checks every access of a kernel
  // against its client's memory), and the exporter reads what it wrote.
  auto module =
      wait(importer->loadModule(importerContext.value(), bytes(testing::kTestKernelsPtx)));
  ASSERT_TRUE(module.ok());
  auto fill = importer->function(module.value(), "fill_u32");
  struct {
    CUdeviceptr p;
    unsigned value;
    unsigned long long n;
  } args{memory.value(), 0x5eedu, kWords};
  ASSERT_EQ(
      importer->launchKernel(importerContext.value(), fill.value().handle,
                             {{1, 1, 1}, {kWords, 1, 1}, 0}, 0, std::as_bytes(std::span(&args, 1))),
      CUDA_SUCCESS);
  EXPECT_EQ(wait(importer->synchronizeContext(importerContext.value())), CUDA_SUCCESS);
  auto seen = wait(exporter->copyDeviceToHost(exporterContext.value(), 0, memory.value(), 4));
  ASSERT_TRUE(seen.ok());
  std::uint32_t first = 0;
  std::memcpy(&first, seen.value().data(), 4);
  EXPECT_EQ(first, 0x5eedu);

  // The exporter frees it while it is open: the memory, and its charge, stay for the importer.
  const std::uint64_t used = shard_.memoryUsed();
  EXPECT_EQ(wait(exporter->free(memory.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), used);
  EXPECT_EQ(shard_.ipcExports().memoryKeptForImporters(), 1u);
  EXPECT_EQ(importer->enqueue(importerContext.value(), 0, memset), CUDA_SUCCESS);
  auto third = newClient(5555);
  auto thirdContext = third->createContext(0);
  EXPECT_EQ(third->openMemory(thirdContext.value(), token.value()).code(), CUDA_ERROR_INVALID_VALUE)
      << "a handle of memory its exporter let go of opened again";
  EXPECT_EQ(wait(importer->closeMemory(memory.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), used);  // one reference is left
  EXPECT_EQ(wait(importer->closeMemory(memory.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), used - 1024);
  EXPECT_EQ(shard_.ipcExports().memoryKeptForImporters(), 0u);
  EXPECT_EQ(wait(importer->closeMemory(memory.value())), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(importer->enqueue(importerContext.value(), 0, memset), CUDA_ERROR_INVALID_VALUE);
}

// An exported interprocess event is one event for both clients: what the importer records, the
// exporter's queries and waits see.
TEST_F(GpuClientTest, AnExportedEventIsOneEventForBothClients) {
  auto exporter = newClient();
  auto importer = newClient(4321);
  auto exporterContext = exporter->createContext(0);
  auto importerContext = importer->createContext(0);
  EXPECT_EQ(exporter->createEvent(exporterContext.value(), CU_EVENT_INTERPROCESS).code(),
            CUDA_ERROR_INVALID_VALUE);  // it must not record timing
  auto timed = exporter->createEvent(exporterContext.value(), 0);
  EXPECT_EQ(exporter->exportEvent(timed.value()).code(), CUDA_ERROR_INVALID_HANDLE);
  auto event = exporter->createEvent(exporterContext.value(),
                                     CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
  ASSERT_TRUE(event.ok());
  auto token = exporter->exportEvent(event.value());
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(exporter->openEvent(exporterContext.value(), token.value()).code(),
            CUDA_ERROR_INVALID_CONTEXT);
  auto opened = importer->openEvent(importerContext.value(), token.value());
  ASSERT_TRUE(opened.ok());

  auto stream = importer->createStream(importerContext.value(), CU_STREAM_NON_BLOCKING, 0);
  launchSpin(*importer, importerContext.value(), stream.value(), 50'000'000);
  ASSERT_EQ(importer->recordEvent(importerContext.value(), opened.value(), stream.value()),
            CUDA_SUCCESS);
  EXPECT_EQ(exporter->queryEvent(event.value()), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(wait(exporter->synchronizeEvent(event.value())), CUDA_SUCCESS);
  EXPECT_EQ(importer->queryEvent(opened.value()), CUDA_SUCCESS);

  // The exporter destroys its event: the importer's is still an event, but the handle opens no
  // more.
  EXPECT_EQ(exporter->destroyEvent(event.value()), CUDA_SUCCESS);
  EXPECT_EQ(importer->queryEvent(opened.value()), CUDA_SUCCESS);
  auto third = newClient(5555);
  auto thirdContext = third->createContext(0);
  EXPECT_EQ(third->openEvent(thirdContext.value(), token.value()).code(), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(importer->destroyEvent(opened.value()), CUDA_SUCCESS);
}

TEST_F(GpuClientTest, FreeWaitsForWorkQueuedBeforeIt) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto stream = client->createStream(context.value(), CU_STREAM_NON_BLOCKING, 0);
  auto pointer = wait(client->allocate(context.value(), 4096));
  launchSpin(*client, context.value(), stream.value(), 50'000'000);
  auto after = client->createEvent(context.value(), CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(client->recordEvent(context.value(), after.value(), stream.value()), CUDA_SUCCESS);
  EXPECT_EQ(client->queryStream(context.value(), stream.value()), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(wait(client->free(pointer.value())), CUDA_SUCCESS);
  // By the time the memory could go to someone else, the kernel before it has finished. (The
  // stream itself may still be busy for a moment: the host callback that ended the wait is work
  // on it too, so look at an event recorded right after the kernel.)
  EXPECT_EQ(client->queryEvent(after.value()), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), stats_[0]->moduleBytes);  // only the module is left
}

// Every operation queued behind a kernel counts against the client's bound on queued work, with
// the bytes the daemon holds for it, until it has run; then nothing is counted.
TEST_F(GpuClientTest, EveryQueuedOperationCountsUntilItHasRun) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto stream = client->createStream(context.value(), CU_STREAM_NON_BLOCKING, 0);
  auto pointer = wait(client->allocate(context.value(), 4096));
  auto event = client->createEvent(context.value(), CU_EVENT_DISABLE_TIMING);
  launchSpin(*client, context.value(), stream.value(), 50'000'000);  // 8 bytes of parameters
  ASSERT_EQ(client->enqueue(context.value(), stream.value(),
                            backend::Memset{pointer.value(), 7, 1, 4096}),
            CUDA_SUCCESS);
  ASSERT_EQ(client->recordEvent(context.value(), event.value(), stream.value()), CUDA_SUCCESS);
  ASSERT_EQ(client->streamWaitEvent(context.value(), stream.value(), event.value()), CUDA_SUCCESS);
  std::vector<std::byte> data(1000, std::byte{1});
  ASSERT_EQ(client->copyHostToDevice(context.value(), stream.value(), pointer.value(), data),
            CUDA_SUCCESS);
  EXPECT_EQ(stats_[0]->operationsInFlight, 5);
  EXPECT_EQ(stats_[0]->bytesInFlight, 8 + 1000);
  EXPECT_FALSE(stats_[0]->queueFull());

  EXPECT_EQ(wait(client->synchronizeStream(context.value(), stream.value())), CUDA_SUCCESS);
  EXPECT_TRUE(soon([&] { return stats_[0]->operationsInFlight == 0; }));
  EXPECT_EQ(stats_[0]->bytesInFlight, 0);
}

// Holds the device's one engine inside a host callback until released, so that whatever is
// queued meanwhile has reached the device and waits there, whatever the machine's speed.
class EngineGate {
public:
  explicit EngineGate(backend::Device& device) : stream_(device.createStream(0, 0)) {
    auto entered = std::make_shared<std::promise<void>>();
    std::future<void> inside = entered->get_future();
    std::shared_future<void> released = release_.get_future().share();
    EXPECT_EQ(stream_.value()->addCallback([entered, released](CUresult) {
      entered->set_value();
      released.wait();
    }),
              CUDA_SUCCESS);
    inside.wait();
  }
  ~EngineGate() { open(); }
  void open() {
    if (!opened_) release_.set_value();
    opened_ = true;
  }

private:
  backend::Result<std::unique_ptr<backend::Stream>> stream_;
  std::promise<void> release_;
  bool opened_ = false;
};

TEST_F(GpuClientTest, AGoneClientGetsBackAtOnceWhatNoWorkOnTheDeviceCanTouch) {
  auto busy = newClient(1);
  auto busyContext = busy->createContext(0);
  auto client = newClient(2);
  auto context = client->createContext(0);
  constexpr std::uint64_t kMiB = 1 << 20;
  auto source = wait(client->allocate(context.value(), kMiB));
  auto target = wait(client->allocate(context.value(), kMiB));
  auto untouched = wait(client->allocate(context.value(), 4 * kMiB));
  ASSERT_TRUE(source.ok() && target.ok() && untouched.ok());
  auto gate = std::make_unique<EngineGate>(shard_.device());
  // Another client's kernel is on the device, so the scheduler holds this client's kernel back;
  // its copy before that reaches the device.
  launchSpin(*busy, busyContext.value(), 0, 1'000'000);
  ASSERT_EQ(client->enqueue(context.value(), 0,
                            backend::CopyDeviceToDevice{target.value(), source.value(), kMiB}),
            CUDA_SUCCESS);
  launchSpin(*client, context.value(), 0, 1'000'000);
  const std::uint64_t moduleBytes = stats_[1]->moduleBytes;
  ASSERT_EQ(shard_.dispatcher().stats().kernelsQueued, 1u);
  const std::uint64_t others = shard_.memoryUsed() - client->memoryUsed();

  // The held kernel is dropped; the copy may still touch its two buffers, nothing else can
  // touch the rest (the kernel that could have gone anywhere will never run).
  EXPECT_EQ(client->abandon(), 4 * kMiB + moduleBytes);
  EXPECT_EQ(shard_.dispatcher().stats().kernelsQueued, 0u);
  EXPECT_EQ(client->memoryUsed(), 2 * kMiB);
  EXPECT_EQ(shard_.memoryUsed(), others + 2 * kMiB);
  EXPECT_EQ(tenant_->memoryUsed(0), others + 2 * kMiB);

  // The copy's buffers come back once it is done.
  gate->open();
  wait(client->drain());
  client.reset();
  EXPECT_EQ(shard_.memoryUsed(), others);
  EXPECT_EQ(stats_[1]->gpuTimeNs, 0u);  // its kernel never ran
  // The other client's did (the copy may have ended before it, beside it, as on a GPU).
  wait(busy->drain());
  EXPECT_GT(stats_[0]->gpuTimeNs, 0u);
  busy.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
}

TEST_F(GpuClientTest, AGoneClientWithAKernelOnTheDeviceKeepsEverythingUntilItIsDone) {
  auto client = newClient();
  auto context = client->createContext(0);
  ASSERT_TRUE(wait(client->allocate(context.value(), 4096)).ok());
  EngineGate gate(shard_.device());
  launchSpin(*client, context.value(), 0, 1'000'000);
  // The kernel reached the device and may follow any pointer of its client's.
  EXPECT_EQ(client->abandon(), 0u);
  EXPECT_EQ(shard_.memoryUsed(), 4096 + stats_[0]->moduleBytes);
  gate.open();
  wait(client->drain());
  client.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  // The sim drops a gone client's work that has not started (a GPU would run it to its end).
  EXPECT_EQ(stats_[0]->gpuTimeNs, 0u);
}

TEST_F(GpuClientTest, TheTenantLimitRefusesAllocationsBeforeTheyReachTheDevice) {
  TenantLimits limits;
  limits.memoryLimit = 1 << 20;
  tenant_->setLimits(limits);
  auto first = newClient(1);
  auto second = newClient(2);
  auto firstContext = first->createContext(0);
  auto secondContext = second->createContext(0);
  // The limit is the tenant's, summed over its clients.
  ASSERT_TRUE(wait(first->allocate(firstContext.value(), 600 << 10)).ok());
  EXPECT_EQ(wait(second->allocate(secondContext.value(), 600 << 10)).code(),
            CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(tenant_->oomCount, 1u);
  EXPECT_EQ(shard_.memoryUsed(), 600u << 10);  // nothing reached the device
  auto fits = wait(second->allocate(secondContext.value(), 400 << 10));
  ASSERT_TRUE(fits.ok());
  // cuMemGetInfo reports the tenant's view: (limit - used, limit).
  auto info = second->memoryInfo(secondContext.value());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info.value().total, 1u << 20);
  EXPECT_EQ(info.value().free, (1u << 20) - (1000u << 10));
  // An absurd size is refused without overflow.
  EXPECT_EQ(wait(first->allocate(firstContext.value(), UINT64_MAX)).code(),
            CUDA_ERROR_OUT_OF_MEMORY);
  // Lowering the limit below what is used frees nothing and blocks new allocations.
  limits.memoryLimit = 512 << 10;
  tenant_->setLimits(limits);
  EXPECT_EQ(shard_.memoryUsed(), 1000u << 10);
  EXPECT_EQ(wait(first->allocate(firstContext.value(), 16)).code(), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(second->memoryInfo(secondContext.value()).value().free, 0u);
  EXPECT_EQ(wait(second->free(fits.value())), CUDA_SUCCESS);
  EXPECT_EQ(tenant_->memoryUsed(0), 600u << 10);
}

TEST_F(GpuClientTest, ModulesCountAgainstTheTenantLimit) {
  TenantLimits limits;
  limits.memoryLimit = 1024;  // smaller than the test kernels' image
  tenant_->setLimits(limits);
  auto client = newClient();
  auto context = client->createContext(0);
  EXPECT_EQ(wait(client->loadModule(context.value(), bytes(testing::kTestKernelsPtx))).code(),
            CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  tenant_->setLimits(TenantLimits{});
  auto module = wait(client->loadModule(context.value(), bytes(testing::kTestKernelsPtx)));
  ASSERT_TRUE(module.ok());
  EXPECT_GT(tenant_->memoryUsed(0), 1024u);
  EXPECT_EQ(wait(client->unloadModule(module.value())), CUDA_SUCCESS);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
}

// cuModuleUnload may wait for the device, so a module is unloaded on the GPU's blocking-call
// thread, whether its client unloads it or goes; its memory is the tenant's again at once.
TEST_F(GpuClientTest, ModulesAreUnloadedOnTheBlockingCallThreadAndCreditedAtOnce) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto unloaded = wait(client->loadModule(context.value(), bytes(testing::kTestKernelsPtx)));
  auto left = wait(client->loadModule(context.value(), bytes(testing::kTestKernelsPtx)));
  ASSERT_TRUE(unloaded.ok());
  ASSERT_TRUE(left.ok());
  const std::uint64_t calls = shard_.blockingCalls().completed;

  EXPECT_EQ(wait(client->unloadModule(unloaded.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), tenant_->memoryUsed(0));
  EXPECT_GT(shard_.memoryUsed(), 0u);
  EXPECT_TRUE(soon([&] { return shard_.blockingCalls().completed == calls + 1; }));

  wait(client->drain());
  client.reset();
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
  EXPECT_TRUE(soon([&] { return shard_.blockingCalls().completed == calls + 2; }));
  EXPECT_EQ(shard_.blockingCalls().pending, 0u);
}

// One kernel that takes `bytes` from the device heap and stores the pointer malloc returned.
constexpr const char* kTakeFromHeapPtx = R"(
.version 7.0
.target sm_80
.address_size 64
.extern .func (.param .b64 func_retval0) malloc (.param .b64 malloc_param_0);
.visible .entry take(.param .u64 out, .param .u64 bytes)
{
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [bytes];
  {
    .param .b64 param0;
    st.param.b64 [param0+0], %rd2;
    .param .b64 retval0;
    call.uni (retval0), malloc, (param0);
    ld.param.b64 %rd3, [retval0+0];
  }
  cvta.to.global.u64 %rd4, %rd1;
  st.global.u64 [%rd4], %rd3;
  ret;
}
)";

// The device heap is the client's memory: as large as its limit said when the first module that
// calls malloc was loaded, charged like an allocation, fixed from then on, and gone with the last
// context, after which the limits are the driver's defaults again.
TEST_F(GpuClientTest, TheDeviceHeapIsTheClientsMemoryOfTheSizeItAskedFor) {
  auto client = newClient();
  auto context = client->createContext(0);
  ASSERT_TRUE(context.ok());
  auto granted = client->setLimit(context.value(), CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 20);
  ASSERT_TRUE(granted.ok());
  EXPECT_EQ(granted.value(), 1u << 20);
  auto out = wait(client->allocate(context.value(), 8));
  ASSERT_TRUE(out.ok());
  const std::uint64_t beforeModule = shard_.memoryUsed();
  auto module = wait(client->loadModule(context.value(), bytes(kTakeFromHeapPtx)));
  ASSERT_TRUE(module.ok());
  EXPECT_GE(shard_.memoryUsed() - beforeModule, 1u << 20);
  EXPECT_EQ(stats_[0]->memoryUsed, shard_.memoryUsed());
  auto take = client->function(module.value(), "take");
  ASSERT_TRUE(take.ok());
  auto takeFromHeap = [&](std::uint64_t bytes) {
    struct {
      CUdeviceptr out;
      std::uint64_t bytes;
    } parameters{out.value(), bytes};
    EXPECT_EQ(client->launchKernel(context.value(), take.value().handle, {{1, 1, 1}, {1, 1, 1}, 0},
                                   0, std::as_bytes(std::span(&parameters, 1))),
              CUDA_SUCCESS);
    auto result = wait(client->copyDeviceToHost(context.value(), 0, out.value(), 8));
    EXPECT_TRUE(result.ok());
    CUdeviceptr pointer = 0;
    std::memcpy(&pointer, result.value().data(), sizeof pointer);
    return pointer;
  };
  EXPECT_NE(takeFromHeap(512 << 10), 0u);
  EXPECT_EQ(takeFromHeap(768 << 10), 0u);  // more than is left of the 1 MiB
  EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_MALLOC_HEAP_SIZE, 2 << 20).code(),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(client->setLimit(context.value(), CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 20).ok());
  EXPECT_EQ(wait(client->destroyContext(context.value())), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);

  // A new context: the default 8 MiB heap, which a 4 MiB tenant limit cannot hold.
  TenantLimits limits;
  limits.memoryLimit = 4 << 20;
  tenant_->setLimits(limits);
  context = client->createContext(0);
  ASSERT_TRUE(context.ok());
  EXPECT_EQ(wait(client->loadModule(context.value(), bytes(kTakeFromHeapPtx))).code(),
            CUDA_ERROR_SHARED_OBJECT_INIT_FAILED);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_MALLOC_HEAP_SIZE, 2 << 20).value(),
            2u << 20);
  EXPECT_TRUE(wait(client->loadModule(context.value(), bytes(kTakeFromHeapPtx))).ok());
  EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4).code(),
            CUDA_ERROR_UNSUPPORTED_LIMIT);
}

// The printf FIFO bounds what is kept of a client's output between its synchronisations; the
// stack is rounded and clamped as the driver does.
TEST_F(GpuClientTest, ThePrintfFifoAndStackLimitsAreTheClientsOwn) {
  auto printOnce = [&](std::uint64_t fifoBytes) {
    auto client = newClient();
    const backend::AddressSpace space = stats_.back()->addressSpace;
    auto context = client->createContext(0);
    EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_PRINTF_FIFO_SIZE, fifoBytes).value(),
              fifoBytes);
    auto module = wait(client->loadModule(context.value(), bytes(testing::kPrintfHelloPtx)));
    auto hello = client->function(module.value(), "hello");
    const int launchNumber = 1;
    EXPECT_EQ(
        client->launchKernel(context.value(), hello.value().handle, {{1, 1, 1}, {256, 1, 1}, 0}, 0,
                             std::as_bytes(std::span(&launchNumber, 1))),
        CUDA_SUCCESS);
    EXPECT_EQ(wait(client->synchronizeContext(context.value())), CUDA_SUCCESS);
    return shard_.device().takeDeviceOutput(space).size();
  };
  // 256 lines of about 70 bytes each.
  EXPECT_GT(printOnce(1 << 20), 12000u);
  const std::size_t kept = printOnce(4096);
  EXPECT_LE(kept, 4096u);
  EXPECT_GT(kept, 3000u);  // the newest lines

  auto client = newClient();
  auto context = client->createContext(0);
  EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_STACK_SIZE, 1000).value(), 1008u);
  EXPECT_EQ(client->setLimit(context.value(), CU_LIMIT_STACK_SIZE, 1ull << 40).value(), 512u << 10);
}

TEST_F(GpuClientTest, KernelTimeAndCountReachTheClientsStats) {
  auto client = newClient();
  auto context = client->createContext(0);
  launchSpin(*client, context.value(), 0, 20'000'000);
  EXPECT_EQ(wait(client->synchronizeContext(context.value())), CUDA_SUCCESS);
  EXPECT_EQ(stats_[0]->kernelsLaunched, 1u);
  EXPECT_GE(stats_[0]->gpuTimeNs, 20'000'000u);
}

TEST_F(GpuClientTest, EventsMeasureTheWorkBetweenThem) {
  auto client = newClient();
  auto context = client->createContext(0);
  auto start = client->createEvent(context.value(), 0);
  auto end = client->createEvent(context.value(), 0);
  EXPECT_EQ(client->recordEvent(context.value(), start.value(), 0), CUDA_SUCCESS);
  launchSpin(*client, context.value(), 0, 30'000'000);
  EXPECT_EQ(client->recordEvent(context.value(), end.value(), 0), CUDA_SUCCESS);
  EXPECT_EQ(wait(client->synchronizeEvent(end.value())), CUDA_SUCCESS);
  auto elapsed = client->eventElapsedTime(start.value(), end.value());
  ASSERT_TRUE(elapsed.ok());
  EXPECT_GE(elapsed.value(), 30.0f);
}

TEST_F(GpuClientTest, PrimaryContextIsReferenceCounted) {
  auto client = newClient();
  auto first = client->retainPrimaryContext();
  auto second = client->retainPrimaryContext();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.value(), second.value());
  ASSERT_TRUE(wait(client->allocate(first.value(), 4096)).ok());
  EXPECT_TRUE(client->primaryContextState().active);
  EXPECT_EQ(wait(client->releasePrimaryContext()), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 4096u);  // still retained once
  EXPECT_EQ(wait(client->releasePrimaryContext()), CUDA_SUCCESS);
  EXPECT_FALSE(client->primaryContextState().active);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  EXPECT_EQ(wait(client->releasePrimaryContext()), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(GpuClientTest, APrimaryContextKeepsItsHandleThroughAReset) {
  auto client = newClient();
  auto before = client->retainPrimaryContext();
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(wait(client->allocate(before.value(), 4096)).ok());
  EXPECT_EQ(wait(client->resetPrimaryContext()), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);  // its resources went
  EXPECT_EQ(wait(client->allocate(before.value(), 4096)).code(), CUDA_ERROR_INVALID_CONTEXT);
  auto after = client->retainPrimaryContext();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after.value(), before.value());  // as the driver's: the runtime relies on it
  EXPECT_TRUE(wait(client->allocate(after.value(), 4096)).ok());
  // An ordinary context never gets that handle.
  auto other = client->createContext(0);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other.value(), before.value());
}

TEST_F(GpuClientTest, AStickyFaultNamesTheClientAndIsRecoveredWhenItsClientsLeave) {
  auto victim = newClient(10);
  auto culprit = newClient(20);
  auto victimContext = victim->createContext(0);
  auto culpritContext = culprit->createContext(0);
  ASSERT_TRUE(wait(victim->allocate(victimContext.value(), 4096)).ok());
  poisonTheGpu(*culprit, culpritContext.value());
  // The synchronise can see the poisoned device before the faulting kernel's own completion has
  // named its client.
  EXPECT_TRUE(soon([&] { return shard_.faultingPid() == 20; })) << shard_.faultingPid();
  // The shared context is poisoned for the other client too.
  EXPECT_EQ(wait(victim->allocate(victimContext.value(), 16)).code(), CUDA_ERROR_ILLEGAL_ADDRESS);
  wait(culprit->drain());
  culprit.reset();
  EXPECT_NE(shard_.stickyError(), CUDA_SUCCESS);  // the victim is still attached
  wait(victim->drain());
  victim.reset();
  // The last one gone, the context is reset on the shard's blocking-call thread, once the
  // culprit's module has been unloaded and the victim's memory freed there; until the reset ends
  // the shard says what it is recovering from, and new contexts wait for it (whenServing).
  EXPECT_TRUE(shard_.resetting());
  EXPECT_EQ(shard_.stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  wait(shard_.whenServing());
  EXPECT_FALSE(shard_.resetting());
  EXPECT_EQ(shard_.stickyError(), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
  // The two allocations, the module's preparation and unload, the victim's memory freed, and the
  // reset.
  EXPECT_EQ(shard_.blockingCalls().completed, 6u);
  auto fresh = newClient(30);
  auto freshContext = fresh->createContext(0);
  EXPECT_TRUE(wait(fresh->allocate(freshContext.value(), 16)).ok());
}

// Virtual memory is the client's, not a context's, and a reset of the GPU's context would take it:
// a client that holds some with no context left holds up the recovery of a poisoned GPU as a
// context does, until it gives it back.
TEST_F(GpuClientTest, AClientHoldingVirtualMemoryHoldsUpTheRecoveryOfAPoisonedGpu) {
  auto holder = newClient(10);
  auto culprit = newClient(20);
  auto holderContext = holder->createContext(0);
  auto physical = wait(holder->createPhysicalMemory(protocol::kVirtualMemoryGranularity));
  ASSERT_TRUE(physical.ok());
  ASSERT_EQ(wait(holder->destroyContext(holderContext.value())), CUDA_SUCCESS);
  auto culpritContext = culprit->createContext(0);
  poisonTheGpu(*culprit, culpritContext.value());
  wait(culprit->drain());
  culprit.reset();
  // Let every blocking call (the culprit's module unload) end: none of them starts the reset.
  EXPECT_TRUE(soon([&] { return shard_.blockingCalls().pending == 0; }));
  EXPECT_FALSE(shard_.resetting());
  EXPECT_EQ(shard_.stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(holder->releasePhysicalMemory(physical.value()), CUDA_SUCCESS);
  EXPECT_TRUE(soon([&] { return shard_.resetting() || shard_.stickyError() == CUDA_SUCCESS; }));
  wait(shard_.whenServing());
  EXPECT_EQ(shard_.stickyError(), CUDA_SUCCESS);
  EXPECT_EQ(shard_.memoryUsed(), 0u);
}

}  // namespace
}  // namespace gpuproxy::server
