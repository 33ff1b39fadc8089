#pragma once
// The control-plane face of one attached client: the Cap'n Proto Gateway (bootstrap of the client
// socket) and Session. A Session routes each call to the GpuClient of the device its handle names.
// When the client goes away (exit, crash, SIGKILL, eviction, daemon shutdown: the connection ends
// either way) Cap'n Proto drops the Session. Its work that has not reached the GPU is dropped,
// what no work on the GPU can touch is freed at once, and its GpuClients are handed to the
// reaper, which waits for the work already on the GPU and then frees the rest.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/shared_segment.hpp"
#include "ipc/unix_socket.hpp"
#include "protocol/limits.hpp"
#include "server/data_plane/client_channel.hpp"
#include "server/gpu/client_stats.hpp"
#include "server/gpu/gpu_client.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/gpu/live_pinned_allocations.hpp"
#include "server/session/gpu_command_executor.hpp"
#include "server/session/pod_identity.hpp"
#include "server/session/session_services.hpp"

#include <kj/debug.h>
#include <kj/vector.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace gpuproxy::server {

class DataPlane;

class ClientSession final : public protocol::Session::Server,
                            private CommandExecutor,
                            private CommandsBeyondOneGpu {
public:
  // `visibleDevices` maps the client's device ordinals to the daemon's devices: a tenant limited
  // to some devices sees only those, numbered from 0, as with CUDA_VISIBLE_DEVICES.
  // `connectionId` is the connection's entry in services.connections (0: none).
  ClientSession(SessionServices services, std::shared_ptr<ClientStats> stats,
                std::vector<std::uint32_t> visibleDevices, std::uint64_t connectionId = 0);
  ~ClientSession() noexcept;

  const ClientStats& stats() const { return *stats_; }
  // Devices this client has made a context or physical memory on, in the order it first did.
  const std::vector<std::uint32_t>& devices() const { return devicesUsed_; }

  // capnp::Capability::Server: every control call first executes what the client already put in
  // its command ring, so its calls keep the order it made them in. While the client is at its
  // bound on queued work and records still wait in its ring, the call waits for them.
  DispatchCallResult dispatchCall(
      std::uint64_t interfaceId, std::uint16_t methodId,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) override;

protected:
  // gpuproxy::protocol::Session
  kj::Promise<void> createContext(CreateContextContext context) override;
  kj::Promise<void> destroyContext(DestroyContextContext context) override;
  kj::Promise<void> retainPrimaryContext(RetainPrimaryContextContext context) override;
  kj::Promise<void> releasePrimaryContext(ReleasePrimaryContextContext context) override;
  kj::Promise<void> resetPrimaryContext(ResetPrimaryContextContext context) override;
  kj::Promise<void> setPrimaryContextFlags(SetPrimaryContextFlagsContext context) override;
  kj::Promise<void> getPrimaryContextState(GetPrimaryContextStateContext context) override;
  kj::Promise<void> memAlloc(MemAllocContext context) override;
  kj::Promise<void> memFree(MemFreeContext context) override;
  kj::Promise<void> memGetInfo(MemGetInfoContext context) override;
  kj::Promise<void> loadModule(LoadModuleContext context) override;
  kj::Promise<void> unloadModule(UnloadModuleContext context) override;
  kj::Promise<void> getFunction(GetFunctionContext context) override;
  kj::Promise<void> createStream(CreateStreamContext context) override;
  kj::Promise<void> destroyStream(DestroyStreamContext context) override;
  kj::Promise<void> createEvent(CreateEventContext context) override;
  kj::Promise<void> destroyEvent(DestroyEventContext context) override;
  kj::Promise<void> eventElapsedTime(EventElapsedTimeContext context) override;
  kj::Promise<void> submit(SubmitContext context) override;
  kj::Promise<void> openDataPlane(OpenDataPlaneContext context) override;
  kj::Promise<void> registerPinned(RegisterPinnedContext context) override;
  kj::Promise<void> unregisterPinned(UnregisterPinnedContext context) override;
  kj::Promise<void> registerHostRange(RegisterHostRangeContext context) override;
  kj::Promise<void> unregisterHostRange(UnregisterHostRangeContext context) override;
  kj::Promise<void> takeDeviceOutput(TakeDeviceOutputContext context) override;
  kj::Promise<void> beginModuleImage(BeginModuleImageContext context) override;
  kj::Promise<void> appendModuleImage(AppendModuleImageContext context) override;
  kj::Promise<void> loadModuleImage(LoadModuleImageContext context) override;
  kj::Promise<void> getGlobal(GetGlobalContext context) override;
  kj::Promise<void> setLimit(SetLimitContext context) override;
  kj::Promise<void> placeManagedVariable(PlaceManagedVariableContext context) override;
  kj::Promise<void> ipcExportMemory(IpcExportMemoryContext context) override;
  kj::Promise<void> ipcOpenMemory(IpcOpenMemoryContext context) override;
  kj::Promise<void> ipcCloseMemory(IpcCloseMemoryContext context) override;
  kj::Promise<void> ipcExportEvent(IpcExportEventContext context) override;
  kj::Promise<void> ipcOpenEvent(IpcOpenEventContext context) override;
  // Virtual memory management (server/session/virtual_memory.cpp).
  kj::Promise<void> memAddressReserve(MemAddressReserveContext context) override;
  kj::Promise<void> memAddressFree(MemAddressFreeContext context) override;
  kj::Promise<void> memCreate(MemCreateContext context) override;
  kj::Promise<void> memRelease(MemReleaseContext context) override;
  kj::Promise<void> memMap(MemMapContext context) override;
  kj::Promise<void> memUnmap(MemUnmapContext context) override;
  kj::Promise<void> memSetAccess(MemSetAccessContext context) override;
  kj::Promise<void> memExport(MemExportContext context) override;
  kj::Promise<void> memImport(MemImportContext context) override;

private:
  class SubmitAnswers;
  class SubmitPort;
  struct SubmitBatch;
  // The executor of one ring pair, on the thread that reads the ring (its GPU's): what the client
  // wrote into the ring of one device goes to that GPU's executor, bound on that thread once the
  // client's state there is made (until then the client has no handle there, and the ring's own
  // executor without a GPU answers), so a ring's records never look at the session's tables, and
  // what the ring tells the session (its framing broke) goes to the session's thread by a message.
  // Made on the session's thread; used and destroyed on the ring's.
  class RingOfDevice final : public CommandExecutor {
  public:
    explicit RingOfDevice(ClientSession& session);
    // kj::Own's destructor is declared noexcept(false); dropping a reference does not throw.
    ~RingOfDevice() noexcept override {}
    RingOfDevice(const RingOfDevice&) = delete;
    RingOfDevice& operator=(const RingOfDevice&) = delete;
    void bind(GpuCommandExecutor& executor) { executor_ = &executor; }
    void execute(const protocol::ring::DecodedCommand& command, CommandPort& port) override {
      (executor_ != nullptr ? *executor_ : noGpu_).execute(command, port);
    }
    bool readyForCommands() const override { return !stats_->queueFull(); }
    void channelBroken(const std::string& reason) override;

  private:
    ClientSession& session_;
    kj::Own<const kj::Executor> sessionThread_;
    std::weak_ptr<const bool> sessionAlive_;
    std::shared_ptr<ClientStats> stats_;
    GpuCommandExecutor noGpu_;
    GpuCommandExecutor* executor_ = nullptr;
  };
  // Where ring pair `ring` is served: the data-plane loop on its GPU's thread, and that thread; the
  // session's own loop and thread for a ring of no GPU (a client that sees none).
  struct RingHome {
    DataPlane* loop;
    const kj::Executor* thread;
  };
  RingHome ringHome(std::uint32_t ring) const;
  // Runs `work(loop)` on the thread that serves ring `ring`, with that ring's loop, by a message
  // nobody waits for (a failure is logged). Messages to one ring run in the order sent.
  template <typename Work>
  void tellRingThread(std::uint32_t ring, Work work);
  // Binds the ring of daemon device `device`, if the client has one, to the device's executor
  // (on the ring's thread).
  void bindRing(std::uint32_t device);
  // The client's state on one GPU, made there together with its record executor.
  struct OpenedClient {
    std::unique_ptr<GpuClient> client;
    std::unique_ptr<GpuCommandExecutor> commands;  // destroyed first: it borrows the client
  };
  // A module image arriving in pieces, charged to the tenant until it is loaded or dropped.
  struct ModuleUpload {
    std::uint64_t context = 0;
    std::uint64_t announced = 0;
    std::vector<std::byte> image;  // what has arrived
    TenantMemoryHold charge;
  };

  // Loads `image` into the client's context `moduleContext` on its GPU, and answers the call
  // (loadModule, loadModuleImage) once the load has ended.
  template <typename Context>
  static kj::Promise<void> answerLoadedModule(Context context, GpuClient& client,
                                              Handle moduleContext, std::vector<std::byte> image) {
    return onGpu(client,
                 [moduleContext, image = std::move(image)](GpuClient& client) mutable {
                   return client.loadModule(moduleContext, std::move(image));
                 })
        .then([context](backend::Result<Handle> module) mutable {
          auto results = context.getResults();
          results.setResult(module.code());
          if (module.ok()) results.setModule(module.value());
        });
  }

  // The upload beginModuleImage asks for, of `bytes` into `moduleContext` on daemon device
  // `device` (whose memory is `memory`): its id goes into `results`; returns the call's result.
  CUresult beginUpload(const backend::Result<backend::MemoryInfo>& memory,
                       std::uint64_t moduleContext, std::uint32_t device, std::uint64_t bytes,
                       protocol::Session::BeginModuleImageResults::Builder results);

  // dispatchCall once the records ahead of the call have left the ring.
  kj::Promise<void> dispatchAfterRing(
      std::uint64_t interfaceId, std::uint16_t methodId,
      capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context);

  // Session.submit's records, executed in order while the client is below its bound on queued
  // work; the rest waits (afterThrottledRecheck) or, past kMaxSubmitsWaiting, fails. Records for
  // one GPU that follow each other go to it in one message and run there; the batch goes on once
  // it has answered, so records of two GPUs keep the order the client gave them.
  kj::Promise<void> executeSubmitted(std::shared_ptr<SubmitBatch> batch);
  // Decodes the batch's records ahead (up to a run's worth), counting the tokens they carry.
  void decodeAhead(SubmitBatch& batch);
  protocol::ring::DecodedCommand nextSubmitted(SubmitBatch& batch);
  void refuseSubmitted(SubmitBatch& batch, CUresult result);
  // The daemon device whose executor takes `command` (GpuCommandExecutor::deviceOf) when the
  // client has state there; nullopt for the executor without a GPU.
  std::optional<std::uint32_t> executingDevice(const protocol::ring::DecodedCommand& command) const;
  static constexpr unsigned kMaxSubmitsWaiting = 16;
  std::shared_ptr<unsigned> submitsWaiting_ = std::make_shared<unsigned>(0);

  // CommandExecutor (server/session/command_execution.cpp): a record of a Session.submit batch that
  // the session's thread executes: one that cannot be framed ends the connection; one that names
  // no GPU of the client's is answered by the executor without one. (A record for a GPU goes to
  // that GPU's thread, executeSubmitted; a ring's records go to their ring's GPU, RingOfDevice.)
  void execute(const protocol::ring::DecodedCommand& command, CommandPort& port) override;
  // Whether every ring's thread has executed all that the client published there so far.
  bool ringsDrained() const;
  // Has each ring that is not drained executed what the client published, on its thread;
  // resolves to whether a ring is left throttled.
  kj::Promise<bool> drainRings();
  bool readyForCommands() const override;
  void channelBroken(const std::string& reason) override;
  // Ends this client's connection: it broke the record format. Every ring stops reading first.
  void evict(const std::string& reason);
  // CommandsBeyondOneGpu.
  void letGoElsewhere(const protocol::ring::LetGoAfterEvent& letGo) override;

  // Pinned host memory (server/session/pinned_memory.cpp).
  kj::Promise<CUresult> registerPinnedRange(std::uint64_t offset, std::uint64_t bytes);
  // Charges `bytes` of pinned memory to the tenant; false (and logged) over its limit.
  bool chargePinned(std::uint64_t bytes);
  // Registers `[host, host + bytes)`, already charged to the tenant, with every GPU, on their
  // blocking-call threads; `keepAlive` keeps it mapped until that is undone. `settled(registered)`
  // runs on this thread once every GPU has answered, if the session is still there; if it is not,
  // or a GPU refused, the registrations made are undone and the charge credited (a reaper task).
  kj::Promise<CUresult> pinForEveryGpu(void* host, std::uint64_t bytes,
                                       std::shared_ptr<const void> keepAlive,
                                       kj::Function<void(bool)> settled);
  // Unregisters a range registered by pinForEveryGpu from every GPU and credits its charge (a
  // reaper task, finished even if the session goes meanwhile); resolves when done.
  kj::Promise<void> unpinFromEveryGpu(void* host, std::uint64_t bytes,
                                      std::shared_ptr<const void> keepAlive);
  // Unregisters what is left at teardown, once `drained` resolves.
  void releasePinnedAtTeardown(kj::Promise<void> drained);

  // The client's state on its visible device `ordinal`, opened on that GPU (a message) on first
  // use; null for a device it cannot see.
  kj::Promise<GpuClient*> openClientOnDevice(std::uint32_t ordinal);
  // The client's state on daemon device `device` if it has been opened; else null.
  GpuClient* clientOnDevice(std::uint32_t device) const;
  // The daemon's index of the client's visible device `ordinal`; nullopt for one it cannot see.
  std::optional<std::uint32_t> deviceForOrdinal(std::uint32_t ordinal) const;
  // The client's ordinal of daemon device `device`; nullopt for one it cannot see.
  std::optional<std::uint32_t> ordinalOf(std::uint32_t device) const;
  // Answers `context` (a call that gives a context) with the context `make` gives the client on
  // device `ordinal`, on that GPU once it serves new contexts: at once, or when the reset of its
  // context now under way ends (GpuShard::whenServing).
  template <typename CallContext, typename Make>
  kj::Promise<void> giveContext(CallContext context, std::uint32_t ordinal, Make make);
  // answerFromGpu (call_answers.hpp) for a call that names a device ordinal.
  template <typename CallContext, typename Operation>
  kj::Promise<void> answerOnDevice(CallContext context, std::uint32_t ordinal, Operation operation);
  // The first of the client's GPUs, in device order, for which `test(client)`, asked on every GPU
  // at once, is true; null when none is.
  template <typename Test>
  kj::Promise<GpuClient*> firstClientWhere(Test test);
  void noteDeviceUsed(std::uint32_t device);
  // The client's state on the device a handle of `kind` names; null when no such state exists.
  GpuClient* clientFor(std::uint64_t handle, HandleKind kind);
  // The GpuClient owning device pointer `pointer`, or null (firstClientWhere).
  kj::Promise<GpuClient*> clientOwning(CUdeviceptr pointer);
  // The GpuClient holding the address reservation `address` lies in, or null.
  kj::Promise<GpuClient*> clientReserving(CUdeviceptr address);
  // The GpuClient of the caller's context `context` when it is on daemon device `device` and
  // `token` is a token's size; else null, and `refused` says why (ipcOpenMemory, ipcOpenEvent).
  GpuClient* clientForIpcOpen(std::uint64_t context, std::uint32_t device,
                              capnp::Data::Reader token, CUresult& refused);

  SessionServices services_;
  std::shared_ptr<ClientStats> stats_;
  std::vector<std::uint32_t> visibleDevices_;
  std::uint64_t connectionId_;
  // By daemon device index: each made on its GPU (openClientOnDevice), and destroyed there.
  std::map<std::uint32_t, std::unique_ptr<GpuClient>> clients_;
  // GpuClients being made, by daemon device index: resolved once in clients_. A call that makes
  // one holds the session until it is answered, unless it may be cancelled: a control call that
  // waited for its rings (dispatchAfterRing) is cancelled when its client goes, and then
  // a GpuClient (and its executor) that arrives after the session is destroyed with the
  // message's answer, which sends it back to its GPU to be destroyed there (MadeOnGpu).
  std::map<std::uint32_t, kj::ForkedPromise<void>> opening_;
  std::vector<std::uint32_t> devicesUsed_;
  // The data plane, once the client asked for it: its segment, and a ring pair per visible
  // device, by the client's device ordinal (the stub writes each record into the ring of its
  // context's device), each served by that GPU's thread and executed by that GPU's executor
  // (RingOfDevice). The session touches a channel only by messages to its ring's thread, except
  // for ClientChannel::drained(), which any thread may ask.
  std::shared_ptr<ClientSegment> segment_;
  std::vector<std::unique_ptr<RingOfDevice>> ringExecutors_;
  std::vector<std::shared_ptr<ClientChannel>> channels_;
  // Whether a ring's framing broke (the connection is being ended; said once).
  bool ringBroken_ = false;
  // Module images being uploaded in pieces (server/session/module_upload.cpp), by upload id.
  static constexpr std::size_t kMaxModuleUploads = 4;
  std::map<std::uint64_t, std::unique_ptr<ModuleUpload>> uploads_;
  std::uint64_t lastUpload_ = 0;
  // Pinned allocations in the channel's pinned heap: offset -> bytes. Each is charged to the
  // tenant and registered with every GPU (registering_ while the GPUs' blocking-call threads do
  // it) until it is unregistered and the work before that has drained (retiring_ meanwhile), or
  // the session ends. Command records are checked against the live ones (pinned_), a table any
  // thread may read, so that whichever thread executes a GPU's records can check them.
  std::map<std::uint64_t, std::uint64_t> registering_;
  std::shared_ptr<LivePinnedAllocations> pinned_ = std::make_shared<LivePinnedAllocations>();
  std::map<std::uint64_t, std::uint64_t> retiring_;
  // Host memory of the client's own that it registered (cuMemHostRegister) from a shared memfd
  // mapping: mapped here at the same address, by address. Charged and registered with every GPU
  // as the pinned heap's allocations are.
  struct HostWindow {
    enum class State { kRegistering, kLive, kRetiring };
    std::uint64_t bytes = 0;
    std::shared_ptr<ipc::SharedSegment> mapping;
    State state = State::kRegistering;
  };
  std::map<std::uint64_t, HostWindow> hostWindows_;
  // Tells continuations that outlive the session (an unregisterPinned's drain) that it is gone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  // The executor of the client's command records on each GPU it uses, by daemon device index:
  // made with its GpuClient on that GPU, destroyed there before it. noGpu_ answers the records
  // of Session.submit that name no GPU of the client's (each ring has one of its own).
  std::map<std::uint32_t, std::unique_ptr<GpuCommandExecutor>> commands_;
  GpuCommandExecutor noGpu_ = GpuCommandExecutor(
      nullptr, *this, kj::getCurrentThreadExecutor().addRef(), alive_, stats_, pinned_);
};

template <typename Work>
void ClientSession::tellRingThread(std::uint32_t ring, Work work) {
  const RingHome home = ringHome(ring);
  home.thread->executeAsync([loop = home.loop, work = std::move(work)]() mutable { work(*loop); })
      .detach([ring](kj::Exception&& exception) {
        KJ_LOG(ERROR, "a message to a ring's thread failed", ring, exception);
      });
}

template <typename Test>
kj::Promise<GpuClient*> ClientSession::firstClientWhere(Test test) {
  kj::Vector<kj::Promise<bool>> answers;
  kj::Vector<GpuClient*> asked;
  for (auto& [device, client] : clients_) {
    asked.add(client.get());
    answers.add(onGpu(*client, test));
  }
  return kj::joinPromises(answers.releaseAsArray())
      .then([asked = asked.releaseAsArray()](kj::Array<bool> found) -> GpuClient* {
        for (std::size_t i = 0; i < found.size(); ++i) {
          if (found[i]) return asked[i];
        }
        return nullptr;
      });
}

// Bootstrap capability of one client connection: knows who is on the other end from the socket.
class ClientGateway final : public protocol::Gateway::Server {
public:
  // `pod` is what the peer's cgroup said when it connected.
  ClientGateway(SessionServices services, ipc::PeerCredentials peer, std::shared_ptr<Tenant> tenant,
                std::uint64_t connectionId = 0, PodIdentity pod = {});

protected:
  // gpuproxy::protocol::Gateway
  kj::Promise<void> attach(AttachContext context) override;

private:
  SessionServices services_;
  ipc::PeerCredentials peer_;
  std::shared_ptr<Tenant> tenant_;
  std::uint64_t connectionId_;
  PodIdentity pod_;
  bool attached_ = false;  // one session per connection
};

// The cgroup a process runs in, from /proc/PID/cgroup: the unified (v2) path when it says more
// than "/", else the most specific v1 path. "" if the process is gone.
std::string cgroupOf(pid_t pid);

}  // namespace gpuproxy::server
