// A client's session whose GPUs are each served by a thread of their own: every control call
// reaches its GPU by message (server/gpu/gpu_messages.hpp), so each works, with the answers a
// client would see, although the session's thread may never touch a GPU's state (the GPU's
// owner-thread check throws if it does, and TSan would see the race). Sessions are attached here
// as TenantSockets attaches them, without a data plane.
#include "server/session/client_session.hpp"
#include "server/daemon/gpu_thread.hpp"

#include "protocol/limits.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/tenant/tenant.hpp"
#include "test_kernels_ptx.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

namespace gpuproxy::server {
namespace {

constexpr std::uint64_t kDeviceMemory = 1ull << 30;

class ReaperErrors final : public kj::TaskSet::ErrorHandler {
public:
  void taskFailed(kj::Exception&& exception) override {
    ADD_FAILURE() << "reclaiming a session failed: " << exception.getDescription().cStr();
  }
};

class ClientSessionTest : public ::testing::Test {
protected:
  ClientSessionTest() {
    facts_.backendName = "sim";
    facts_.schedulerName = "fair";
    for (auto& gpu : threads_) gpus_.push_back(&gpu->shard());
  }

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~ClientSessionTest() noexcept override {}

  protocol::Session::Client attach() {
    const ipc::PeerCredentials peer{::getpid(), ::getuid(), ::getgid()};
    auto registration = connections_.add(peer.pid, tenant_->id());
    protocol::Gateway::Client gateway = kj::heap<ClientGateway>(
        SessionServices{facts_, gpus_, sessions_, connections_, reaper_, nullptr}, peer, tenant_,
        registration.id);
    auto request = gateway.attachRequest();
    request.setProtocolVersion(protocol::PROTOCOL_VERSION);
    auto answer = request.send().wait(waitScope());
    EXPECT_EQ(answer.getResult(), CUDA_SUCCESS);
    return answer.getSession();
  }

  GpuStatus statusOf(std::uint32_t device) {
    return onGpu(*gpus_[device], [](GpuShard& gpu) { return gpu.status(); }).wait(waitScope());
  }

  // Turns the event loop until `condition` holds, for up to 10 s.
  template <typename Condition>
  bool soon(Condition&& condition) {
    for (int turn = 0; turn < 10000; ++turn) {
      if (condition()) return true;
      io_->provider->getTimer().afterDelay(kj::MILLISECONDS).wait(waitScope());
    }
    return condition();
  }

  kj::WaitScope& waitScope() { return io_->waitScope; }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::unique_ptr<backend::Backend> backend_ =
      sim::newSimBackend(sim::SimOptions{2, kDeviceMemory});
  std::vector<std::unique_ptr<GpuThread>> threads_ = [this] {
    std::vector<std::unique_ptr<GpuThread>> threads;
    threads.push_back(GpuThread::start(*backend_, 0).value());
    threads.push_back(GpuThread::start(*backend_, 1).value());
    return threads;
  }();
  Gpus gpus_;
  DaemonFacts facts_;
  std::set<ClientSession*> sessions_;
  ConnectionRegistry connections_;
  ReaperErrors reaperErrors_;
  kj::TaskSet reaper_{reaperErrors_};
  std::shared_ptr<Tenant> tenant_ =
      std::make_shared<Tenant>(1, TenantDefinition{"session", "/unused", TenantLimits{}});
};

TEST_F(ClientSessionTest, EveryControlCallWorksWhenEachGpuHasAThreadOfItsOwn) {
  protocol::Session::Client session = attach();
  auto& scope = waitScope();

  // A context on each GPU (made there), and device memory on each.
  std::uint64_t contexts[2] = {};
  CUdeviceptr pointers[2] = {};
  for (std::uint32_t device = 0; device < 2; ++device) {
    auto create = session.createContextRequest();
    create.setDevice(device);
    auto context = create.send().wait(scope);
    ASSERT_EQ(context.getResult(), CUDA_SUCCESS);
    contexts[device] = context.getContext();
    auto alloc = session.memAllocRequest();
    alloc.setContext(contexts[device]);
    alloc.setBytes(1 << 20);
    auto allocated = alloc.send().wait(scope);
    ASSERT_EQ(allocated.getResult(), CUDA_SUCCESS);
    pointers[device] = allocated.getPointer();
  }
  EXPECT_EQ(statusOf(0).clients, 1u);
  EXPECT_EQ(statusOf(1).clients, 1u);
  EXPECT_GE(tenant_->memoryUsed(1), 1u << 20);

  auto info = session.memGetInfoRequest();
  info.setContext(contexts[1]);
  auto memory = info.send().wait(scope);
  EXPECT_EQ(memory.getResult(), CUDA_SUCCESS);
  EXPECT_EQ(memory.getTotal(), kDeviceMemory);
  EXPECT_LT(memory.getFree(), memory.getTotal());

  // The primary context of device 1: retained, its state read, released.
  auto retain = session.retainPrimaryContextRequest();
  retain.setDevice(1);
  EXPECT_EQ(retain.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto state = session.getPrimaryContextStateRequest();
  state.setDevice(1);
  auto primary = state.send().wait(scope);
  EXPECT_EQ(primary.getResult(), CUDA_SUCCESS);
  EXPECT_TRUE(primary.getActive());
  auto release = session.releasePrimaryContextRequest();
  release.setDevice(1);
  EXPECT_EQ(release.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto unseen = session.getPrimaryContextStateRequest();
  unseen.setDevice(7);
  EXPECT_EQ(unseen.send().wait(scope).getResult(), CUDA_ERROR_INVALID_DEVICE);

  // A module on device 1, a function's layout, a variable it does not have.
  auto load = session.loadModuleRequest();
  load.setContext(contexts[1]);
  const std::size_t imageBytes = std::strlen(testing::kTestKernelsPtx) + 1;
  load.setImage(
      kj::arrayPtr(reinterpret_cast<const capnp::byte*>(testing::kTestKernelsPtx), imageBytes));
  auto module = load.send().wait(scope);
  ASSERT_EQ(module.getResult(), CUDA_SUCCESS);
  auto function = session.getFunctionRequest();
  function.setModule(module.getModule());
  function.setName("vector_add");
  auto vectorAdd = function.send().wait(scope);
  ASSERT_EQ(vectorAdd.getResult(), CUDA_SUCCESS);
  EXPECT_EQ(vectorAdd.getLayout().getParameters().size(), 4u);
  EXPECT_EQ(vectorAdd.getLayout().getParameterBytes(), 28u);
  auto global = session.getGlobalRequest();
  global.setModule(module.getModule());
  global.setName("no_such_variable");
  EXPECT_EQ(global.send().wait(scope).getResult(), CUDA_ERROR_NOT_FOUND);

  // A stream and an event on device 0.
  auto stream = session.createStreamRequest();
  stream.setContext(contexts[0]);
  auto created = stream.send().wait(scope);
  ASSERT_EQ(created.getResult(), CUDA_SUCCESS);
  auto event = session.createEventRequest();
  event.setContext(contexts[0]);
  auto made = event.send().wait(scope);
  ASSERT_EQ(made.getResult(), CUDA_SUCCESS);

  // A pointer's GPU is found by asking both: device 1's allocation is exported from device 1.
  auto exportMemory = session.ipcExportMemoryRequest();
  exportMemory.setPointer(pointers[1] + 64);
  auto exported = exportMemory.send().wait(scope);
  EXPECT_EQ(exported.getResult(), CUDA_SUCCESS);
  EXPECT_EQ(exported.getDevice(), 1u);
  auto close = session.ipcCloseMemoryRequest();
  close.setPointer(pointers[0]);  // its own memory, never opened through IPC
  EXPECT_EQ(close.send().wait(scope).getResult(), CUDA_ERROR_INVALID_VALUE);

  // Virtual memory on device 1: addresses reserved, physical memory made, mapped, unmapped.
  auto reserve = session.memAddressReserveRequest();
  reserve.setContext(contexts[1]);
  reserve.setBytes(2 << 20);
  auto reserved = reserve.send().wait(scope);
  ASSERT_EQ(reserved.getResult(), CUDA_SUCCESS);
  auto createMemory = session.memCreateRequest();
  createMemory.setDevice(1);
  createMemory.setBytes(2 << 20);
  auto physical = createMemory.send().wait(scope);
  ASSERT_EQ(physical.getResult(), CUDA_SUCCESS);
  auto map = session.memMapRequest();
  map.setPointer(reserved.getPointer());
  map.setBytes(2 << 20);
  map.setHandle(physical.getHandle());
  EXPECT_EQ(map.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto access = session.memSetAccessRequest();
  access.setPointer(reserved.getPointer());
  access.setBytes(2 << 20);
  access.setFlags(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(access.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto unmap = session.memUnmapRequest();
  unmap.setPointer(reserved.getPointer());
  unmap.setBytes(2 << 20);
  EXPECT_EQ(unmap.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto releaseMemory = session.memReleaseRequest();
  releaseMemory.setHandle(physical.getHandle());
  EXPECT_EQ(releaseMemory.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto freeAddresses = session.memAddressFreeRequest();
  freeAddresses.setPointer(reserved.getPointer());
  freeAddresses.setBytes(2 << 20);
  EXPECT_EQ(freeAddresses.send().wait(scope).getResult(), CUDA_SUCCESS);

  auto limit = session.setLimitRequest();
  limit.setContext(contexts[0]);
  limit.setLimit(CU_LIMIT_STACK_SIZE);
  limit.setValue(4096);
  auto granted = limit.send().wait(scope);
  EXPECT_EQ(granted.getResult(), CUDA_SUCCESS);
  EXPECT_GE(granted.getValue(), 4096u);

  auto output = session.takeDeviceOutputRequest().send().wait(scope);
  EXPECT_EQ(output.getText().size(), 0u);

  // Device 1's memory is freed from device 1; a pointer no GPU holds is refused.
  auto free = session.memFreeRequest();
  free.setPointer(pointers[1]);
  EXPECT_EQ(free.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto freeAgain = session.memFreeRequest();
  freeAgain.setPointer(pointers[1]);
  EXPECT_EQ(freeAgain.send().wait(scope).getResult(), CUDA_ERROR_INVALID_VALUE);

  auto destroyEvent = session.destroyEventRequest();
  destroyEvent.setEvent(made.getEvent());
  EXPECT_EQ(destroyEvent.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto destroyStream = session.destroyStreamRequest();
  destroyStream.setStream(created.getStream());
  EXPECT_EQ(destroyStream.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto unload = session.unloadModuleRequest();
  unload.setModule(module.getModule());
  EXPECT_EQ(unload.send().wait(scope).getResult(), CUDA_SUCCESS);
  auto destroy = session.destroyContextRequest();
  destroy.setContext(contexts[1]);
  EXPECT_EQ(destroy.send().wait(scope).getResult(), CUDA_SUCCESS);

  // The client goes, holding device 0's context and memory: both GPUs get everything back, each
  // on its own thread.
  session = nullptr;
  ASSERT_TRUE(soon([&] { return sessions_.empty(); }));
  EXPECT_TRUE(soon([&] {
    const GpuStatus first = statusOf(0);
    const GpuStatus second = statusOf(1);
    return first.clients == 0 && second.clients == 0 && first.memoryUsed == 0 &&
           second.memoryUsed == 0;
  }));
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
  EXPECT_EQ(tenant_->memoryUsed(1), 0u);
}

}  // namespace
}  // namespace gpuproxy::server
