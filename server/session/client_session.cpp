#include "server/session/client_session.hpp"

#include "server/data_plane/data_plane.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/session/call_answers.hpp"

#include "protocol/cuda_result.hpp"

#include <capnp/message.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <span>
#include <string>
#include <utility>

namespace gpuproxy::server {

namespace {

std::span<const std::byte> bytesOf(capnp::Data::Reader data) {
  return {reinterpret_cast<const std::byte*>(data.begin()), data.size()};
}

}  // namespace

ClientSession::ClientSession(SessionServices services, std::shared_ptr<ClientStats> stats,
                             std::vector<std::uint32_t> visibleDevices, std::uint64_t connectionId)
    : services_(services),
      stats_(std::move(stats)),
      visibleDevices_(std::move(visibleDevices)),
      connectionId_(connectionId) {
  services_.sessions.insert(this);
  ++stats_->tenant->clients;
}

ClientSession::~ClientSession() noexcept {
  *alive_ = false;
  // The rings first, each on its thread: nothing may execute a command of this client once
  // teardown has begun, and what answers still come (from executors not yet destroyed on their
  // GPUs) reach no session. Each ring's executor goes there too. These messages go before those
  // below, so each GPU stops reading the ring before the executor it feeds goes.
  // Reaper tasks, so that the daemon stops no GPU's thread before the ring has left its loop.
  for (std::uint32_t ring = 0; ring < channels_.size(); ++ring) {
    const RingHome home = ringHome(ring);
    services_.reaper.add(
        home.thread->executeAsync([loop = home.loop, channel = channels_[ring],
                                   executor = std::move(ringExecutors_[ring])]() mutable {
          loop->remove(*channel);
          channel->detachExecutor();
          executor.reset();
        }));
  }
  kj::Vector<kj::Promise<void>> drains;
  services_.sessions.erase(this);
  --stats_->tenant->clients;
  const ClientIdentity& who = stats_->identity;
  spdlog::info("client pid {} ({}) detached; reclaiming what it held", who.pid, who.command);
  for (auto& [device, client] : clients_) {
    GpuClient& gone = *client;
    std::unique_ptr<GpuCommandExecutor> commands;
    if (auto found = commands_.find(device); found != commands_.end()) {
      commands = std::move(found->second);
    }
    // On its GPU, by a message that owns it from here on: its records' answers still to come are
    // dropped; what has not reached the device yet never runs; what nothing on the device can
    // touch any more comes back now; the rest once the work that may touch it is done, when the
    // GpuClient is destroyed there.
    auto reclaimed =
        onGpu(gone, [client = std::move(client), commands = std::move(commands),
                     pid = who.pid](GpuClient&) mutable {
          commands.reset();
          const std::uint32_t index = client->deviceIndex();
          const std::uint64_t freedNow = client->abandon();
          const std::uint64_t held = client->memoryUsed();
          if (freedNow > 0) {
            spdlog::info("device {}: reclaimed {} bytes of pid {} at once", index, freedNow, pid);
          }
          return client->drain().then([client = std::move(client), held, pid, index]() mutable {
            client.reset();
            if (held > 0) {
              spdlog::info(
                  "device {}: reclaimed {} bytes of pid {} once its work on the device was "
                  "done",
                  index, held, pid);
            }
          });
        }).fork();
    drains.add(reclaimed.addBranch());
    services_.reaper.add(reclaimed.addBranch());
  }
  // Pinned memory stays registered (and the segment mapped) until the work that may use it is
  // over.
  releasePinnedAtTeardown(kj::joinPromises(drains.releaseAsArray()));
  channels_.clear();
}

std::optional<std::uint32_t> ClientSession::ordinalOf(std::uint32_t device) const {
  for (std::uint32_t ordinal = 0; ordinal < visibleDevices_.size(); ++ordinal) {
    if (visibleDevices_[ordinal] == device && deviceForOrdinal(ordinal)) return ordinal;
  }
  return std::nullopt;
}

std::optional<std::uint32_t> ClientSession::deviceForOrdinal(std::uint32_t ordinal) const {
  if (ordinal >= visibleDevices_.size()) return std::nullopt;
  const std::uint32_t device = visibleDevices_[ordinal];
  if (device >= services_.gpus.size()) return std::nullopt;
  return device;
}

kj::Promise<GpuClient*> ClientSession::openClientOnDevice(std::uint32_t ordinal) {
  const std::optional<std::uint32_t> device = deviceForOrdinal(ordinal);
  if (!device) return static_cast<GpuClient*>(nullptr);
  if (GpuClient* open = clientOnDevice(*device)) {
    opening_.erase(*device);  // made; not erased in its own continuation, which it would free
    return open;
  }
  auto opening = opening_.find(*device);
  if (opening == opening_.end()) {
    // Made on the GPU, by a message; a second call for the same device meanwhile waits for it.
    // Its record executor is made with it, there.
    auto opened =
        onGpu(*services_.gpus[*device], [stats = stats_, pinned = pinned_,
                                         alive = std::weak_ptr<const bool>(alive_),
                                         session = static_cast<CommandsBeyondOneGpu*>(this),
                                         sessionThread = kj::getCurrentThreadExecutor().addRef()](
                                            GpuShard& gpu) mutable {
          auto opened = std::make_unique<OpenedClient>();
          opened->client = gpu.openClient(stats);
          opened->commands = std::make_unique<GpuCommandExecutor>(
              opened->client.get(), *session, kj::mv(sessionThread), alive, stats, pinned);
          return MadeOnGpu<OpenedClient>(std::move(opened), gpu.executor());
        }).then([this, device = *device](MadeOnGpu<OpenedClient> made) {
          std::unique_ptr<OpenedClient> opened = made.take();
          commands_.emplace(device, std::move(opened->commands));
          clients_.emplace(device, std::move(opened->client));
          bindRing(device);
        });
    opening = opening_.emplace(*device, opened.fork()).first;
  }
  return opening->second.addBranch().then(
      [this, device = *device]() -> GpuClient* { return clientOnDevice(device); });
}

GpuClient* ClientSession::clientOnDevice(std::uint32_t device) const {
  auto found = clients_.find(device);
  return found == clients_.end() ? nullptr : found->second.get();
}

GpuClient* ClientSession::clientFor(std::uint64_t handle, HandleKind kind) {
  auto device = deviceOf(handle, kind);
  return device ? clientOnDevice(*device) : nullptr;
}

kj::Promise<GpuClient*> ClientSession::clientOwning(CUdeviceptr pointer) {
  return firstClientWhere([pointer](GpuClient& client) { return client.ownsAllocation(pointer); });
}

// ---------------------------------------------------------------------------------------------
// Contexts

template <typename CallContext, typename Make>
kj::Promise<void> ClientSession::giveContext(CallContext context, std::uint32_t ordinal,
                                             Make make) {
  return openClientOnDevice(ordinal).then(
      [this, context, make = std::move(make)](GpuClient* client) mutable -> kj::Promise<void> {
        if (client == nullptr) {
          context.getResults().setResult(CUDA_ERROR_INVALID_DEVICE);
          return kj::READY_NOW;
        }
        const std::uint32_t device = client->deviceIndex();
        // Made once the GPU serves: a reset of its context under way would take a new one.
        return onGpu(*client,
                     [make = std::move(make)](GpuClient& client) mutable {
                       return client.whenGpuServes().then(
                           [&client, make = std::move(make)]() mutable { return make(client); });
                     })
            .then([this, context, device](backend::Result<Handle> given) mutable {
              auto results = context.getResults();
              results.setResult(given.code());
              if (given.ok()) {
                results.setContext(given.value());
                noteDeviceUsed(device);
              }
            });
      });
}

template <typename CallContext, typename Operation>
kj::Promise<void> ClientSession::answerOnDevice(CallContext context, std::uint32_t ordinal,
                                                Operation operation) {
  return openClientOnDevice(ordinal).then(
      [context, operation = std::move(operation)](GpuClient* client) mutable {
        return answerFromGpu(context, client, CUDA_ERROR_INVALID_DEVICE, std::move(operation));
      });
}

kj::Promise<void> ClientSession::createContext(CreateContextContext context) {
  const unsigned flags = context.getParams().getFlags();
  return giveContext(context, context.getParams().getDevice(),
                     [flags](GpuClient& client) { return client.createContext(flags); });
}

void ClientSession::noteDeviceUsed(std::uint32_t device) {
  if (std::find(devicesUsed_.begin(), devicesUsed_.end(), device) == devicesUsed_.end()) {
    devicesUsed_.push_back(device);
  }
}

kj::Promise<void> ClientSession::destroyContext(DestroyContextContext context) {
  const std::uint64_t handle = context.getParams().getContext();
  return answerFromGpu(context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
                       [handle](GpuClient& client) { return client.destroyContext(handle); });
}

kj::Promise<void> ClientSession::retainPrimaryContext(RetainPrimaryContextContext context) {
  return giveContext(context, context.getParams().getDevice(),
                     [](GpuClient& client) { return client.retainPrimaryContext(); });
}

kj::Promise<void> ClientSession::releasePrimaryContext(ReleasePrimaryContextContext context) {
  return answerOnDevice(context, context.getParams().getDevice(),
                        [](GpuClient& client) { return client.releasePrimaryContext(); });
}

kj::Promise<void> ClientSession::resetPrimaryContext(ResetPrimaryContextContext context) {
  return answerOnDevice(context, context.getParams().getDevice(),
                        [](GpuClient& client) { return client.resetPrimaryContext(); });
}

kj::Promise<void> ClientSession::setPrimaryContextFlags(SetPrimaryContextFlagsContext context) {
  const unsigned flags = context.getParams().getFlags();
  return answerOnDevice(context, context.getParams().getDevice(), [flags](GpuClient& client) {
    return client.setPrimaryContextFlags(flags);
  });
}

kj::Promise<void> ClientSession::getPrimaryContextState(GetPrimaryContextStateContext context) {
  return openClientOnDevice(context.getParams().getDevice())
      .then([context](GpuClient* client) mutable -> kj::Promise<void> {
        if (client == nullptr) {
          context.getResults().setResult(CUDA_ERROR_INVALID_DEVICE);
          return kj::READY_NOW;
        }
        return onGpu(*client, [](GpuClient& client) { return client.primaryContextState(); })
            .then([context](PrimaryContextState primary) mutable {
              auto results = context.getResults();
              results.setResult(CUDA_SUCCESS);
              results.setFlags(primary.flags);
              results.setActive(primary.active);
            });
      });
}

// ---------------------------------------------------------------------------------------------
// Memory

kj::Promise<void> ClientSession::memAlloc(MemAllocContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  const std::uint64_t bytes = params.getBytes();
  return answerCreated(
      context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [handle, bytes](GpuClient& client) { return client.allocate(handle, bytes); },
      [](auto& results, CUdeviceptr pointer) { results.setPointer(pointer); });
}

kj::Promise<void> ClientSession::memFree(MemFreeContext context) {
  const CUdeviceptr pointer = context.getParams().getPointer();
  return clientOwning(pointer).then([context, pointer](GpuClient* owner) mutable {
    return answerFromGpu(context, owner, CUDA_ERROR_INVALID_VALUE,
                         [pointer](GpuClient& client) { return client.free(pointer); });
  });
}

kj::Promise<void> ClientSession::memGetInfo(MemGetInfoContext context) {
  const std::uint64_t handle = context.getParams().getContext();
  return answerCreated(
      context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [handle](GpuClient& client) { return client.memoryInfo(handle); },
      [](auto& results, const backend::MemoryInfo& info) {
        results.setFree(info.free);
        results.setTotal(info.total);
      });
}

kj::Promise<void> ClientSession::setLimit(SetLimitContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  const auto limit = static_cast<CUlimit>(params.getLimit());
  const std::uint64_t value = params.getValue();
  GpuClient* client = clientFor(handle, HandleKind::kContext);
  if (client != nullptr && limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_PRINTF_FIFO_SIZE &&
      limit != CU_LIMIT_MALLOC_HEAP_SIZE) {
    context.getResults().setResult(CUDA_ERROR_UNSUPPORTED_LIMIT);
    return kj::READY_NOW;
  }
  return answerCreated(
      context, client, CUDA_ERROR_INVALID_CONTEXT,
      [handle, limit, value](GpuClient& client) { return client.setLimit(handle, limit, value); },
      [](auto& results, std::uint64_t granted) { results.setValue(granted); });
}

// ---------------------------------------------------------------------------------------------
// Modules and kernels

kj::Promise<void> ClientSession::loadModule(LoadModuleContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  GpuClient* client = clientFor(handle, HandleKind::kContext);
  if (client == nullptr) {
    context.getResults().setResult(CUDA_ERROR_INVALID_CONTEXT);
    return kj::READY_NOW;
  }
  const auto bytes = bytesOf(params.getImage());
  return answerLoadedModule(context, *client, handle, {bytes.begin(), bytes.end()});
}

kj::Promise<void> ClientSession::unloadModule(UnloadModuleContext context) {
  const std::uint64_t handle = context.getParams().getModule();
  return answerFromGpu(context, clientFor(handle, HandleKind::kModule), CUDA_ERROR_INVALID_HANDLE,
                       [handle](GpuClient& client) { return client.unloadModule(handle); });
}

kj::Promise<void> ClientSession::getGlobal(GetGlobalContext context) {
  auto params = context.getParams();
  const std::uint64_t module = params.getModule();
  return answerCreated(
      context, clientFor(module, HandleKind::kModule), CUDA_ERROR_INVALID_HANDLE,
      [module, name = std::string(params.getName().cStr())](GpuClient& client) {
        return client.global(module, name);
      },
      [](auto& results, const backend::GlobalVariable& variable) {
        results.setPointer(variable.address);
        results.setBytes(variable.bytes);
        results.setManaged(variable.managed);
      });
}

kj::Promise<void> ClientSession::placeManagedVariable(PlaceManagedVariableContext context) {
  auto params = context.getParams();
  const std::uint64_t module = params.getModule();
  return answerFromGpu(
      context, clientFor(module, HandleKind::kModule), CUDA_ERROR_INVALID_HANDLE,
      [module, name = std::string(params.getName().cStr()), address = params.getAddress(),
       keepValue = params.getKeepValue()](GpuClient& client) {
        return client.placeManagedVariable(module, name, address, keepValue);
      });
}

kj::Promise<void> ClientSession::getFunction(GetFunctionContext context) {
  auto params = context.getParams();
  const std::uint64_t module = params.getModule();
  return answerCreated(
      context, clientFor(module, HandleKind::kModule), CUDA_ERROR_INVALID_HANDLE,
      [module, name = std::string(params.getName().cStr())](GpuClient& client) {
        return client.function(module, name);
      },
      [](auto& results, const FunctionHandle& function) {
        results.setFunction(function.handle);
        const backend::FunctionInfo& info = function.info;
        auto layout = results.initLayout();
        auto parameters = layout.initParameters(static_cast<unsigned>(info.parameters.size()));
        for (unsigned i = 0; i < info.parameters.size(); ++i) {
          parameters[i].setOffset(info.parameters[i].offset);
          parameters[i].setSize(info.parameters[i].size);
        }
        layout.setParameterBytes(info.parameterBytes);
        layout.setMaxThreadsPerBlock(info.maxThreadsPerBlock);
        layout.setSharedSizeBytes(info.sharedSizeBytes);
        layout.setNumRegs(info.numRegs);
        layout.setLocalSizeBytes(info.localSizeBytes);
        layout.setConstSizeBytes(info.constSizeBytes);
        layout.setPtxVersion(info.ptxVersion);
        layout.setBinaryVersion(info.binaryVersion);
      });
}

// ---------------------------------------------------------------------------------------------
// Streams

kj::Promise<void> ClientSession::createStream(CreateStreamContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  return answerCreated(
      context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [handle, flags = params.getFlags(), priority = params.getPriority()](GpuClient& client) {
        return client.createStream(handle, flags, priority);
      },
      [](auto& results, Handle stream) { results.setStream(stream); });
}

kj::Promise<void> ClientSession::destroyStream(DestroyStreamContext context) {
  const std::uint64_t handle = context.getParams().getStream();
  return answerFromGpu(context, clientFor(handle, HandleKind::kStream), CUDA_ERROR_INVALID_HANDLE,
                       [handle](GpuClient& client) { return client.destroyStream(handle); });
}

// ---------------------------------------------------------------------------------------------
// Events

kj::Promise<void> ClientSession::createEvent(CreateEventContext context) {
  auto params = context.getParams();
  const std::uint64_t handle = params.getContext();
  return answerCreated(
      context, clientFor(handle, HandleKind::kContext), CUDA_ERROR_INVALID_CONTEXT,
      [handle, flags = params.getFlags()](GpuClient& client) {
        return client.createEvent(handle, flags);
      },
      [](auto& results, Handle event) { results.setEvent(event); });
}

kj::Promise<void> ClientSession::destroyEvent(DestroyEventContext context) {
  const std::uint64_t handle = context.getParams().getEvent();
  return answerFromGpu(context, clientFor(handle, HandleKind::kEvent), CUDA_ERROR_INVALID_HANDLE,
                       [handle](GpuClient& client) { return client.destroyEvent(handle); });
}

kj::Promise<void> ClientSession::eventElapsedTime(EventElapsedTimeContext context) {
  auto params = context.getParams();
  const std::uint64_t start = params.getStart();
  const std::uint64_t end = params.getEnd();
  GpuClient* client = clientFor(start, HandleKind::kEvent);
  if (client != nullptr && handleDevice(end) != client->deviceIndex()) client = nullptr;
  return answerCreated(
      context, client, CUDA_ERROR_INVALID_HANDLE,
      [start, end](GpuClient& client) { return client.eventElapsedTime(start, end); },
      [](auto& results, float milliseconds) { results.setMilliseconds(milliseconds); });
}

// ---------------------------------------------------------------------------------------------
// Gateway

ClientGateway::ClientGateway(SessionServices services, ipc::PeerCredentials peer,
                             std::shared_ptr<Tenant> tenant, std::uint64_t connectionId,
                             PodIdentity pod)
    : services_(services),
      peer_(peer),
      tenant_(std::move(tenant)),
      connectionId_(connectionId),
      pod_(std::move(pod)) {}

std::string cgroupOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  std::string unified;
  std::string legacy;
  while (std::getline(in, line)) {
    // hierarchy-ID:controllers:path
    auto first = line.find(':');
    auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    std::string path = line.substr(second + 1);
    if (line.compare(0, second + 1, "0::") == 0) {
      unified = path;
    } else if (path.size() > legacy.size()) {
      legacy = path;
    }
  }
  if (!unified.empty() && unified != "/") return unified;
  if (!legacy.empty()) return legacy;
  return unified;
}

kj::Promise<void> ClientGateway::attach(AttachContext context) {
  auto results = context.getResults();
  std::uint32_t version = context.getParams().getProtocolVersion();
  if (version != protocol::PROTOCOL_VERSION) {
    spdlog::warn("pid {} speaks protocol {}, this daemon speaks {}: refusing it", peer_.pid,
                 version, protocol::PROTOCOL_VERSION);
    results.setResult(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
    return kj::READY_NOW;
  }
  if (attached_) {
    // Each session costs descriptors and memory; a connection carries one, so a tenant's
    // connection limit bounds its sessions too.
    spdlog::warn("pid {} asked to attach twice on one connection: refused", peer_.pid);
    results.setResult(CUDA_ERROR_ALREADY_ACQUIRED);
    return kj::READY_NOW;
  }
  attached_ = true;
  auto stats = std::make_shared<ClientStats>();
  stats->identity =
      ClientIdentity{peer_.pid,           peer_.uid,   peer_.gid,       ipc::processName(peer_.pid),
                     cgroupOf(peer_.pid), pod_.podUid, pod_.containerId};
  stats->tenant = tenant_;
  // Connection ids are never reused, so neither are address spaces.
  stats->addressSpace = connectionId_;
  std::vector<std::uint32_t> visible;
  for (std::uint32_t i = 0; i < services_.gpus.size(); ++i) {
    if (tenant_->mayUseDevice(i)) visible.push_back(i);
  }
  spdlog::info("client pid {} ({}, uid {}, cgroup {}) attached as tenant '{}' (id {}){}", peer_.pid,
               stats->identity.command, peer_.uid, stats->identity.cgroup, tenant_->name(),
               tenant_->id(),
               pod_.podUid.empty() ? std::string()
                                   : ", pod " + pod_.podUid + " container " +
                                         (pod_.containerId.empty() ? "?" : pod_.containerId));
  results.setResult(CUDA_SUCCESS);
  results.setSession(kj::heap<ClientSession>(services_, std::move(stats), visible, connectionId_));
  results.setBackend(services_.facts.backendName);
  results.setDriverVersion(services_.facts.driverVersion);
  // Each GPU's stream priorities are its state (a reset under way keeps those from before it):
  // asked of each by a message. Its properties are fixed once it is open.
  kj::Vector<kj::Promise<backend::StreamPriorityRange>> asked;
  for (std::uint32_t device : visible) {
    asked.add(
        onGpu(*services_.gpus[device], [](GpuShard& gpu) { return gpu.streamPriorityRange(); }));
  }
  return kj::joinPromises(asked.releaseAsArray())
      .then([this, context, visible = std::move(visible)](
                kj::Array<backend::StreamPriorityRange> priorities) mutable {
        auto devices = context.getResults().initDevices(static_cast<unsigned>(visible.size()));
        for (unsigned i = 0; i < visible.size(); ++i) {
          const backend::DeviceProperties& properties = services_.gpus[visible[i]]->properties();
          auto device = devices[i];
          device.setIndex(i);
          device.setName(properties.name);
          device.setUuid(kj::arrayPtr(properties.uuid.data(), properties.uuid.size()));
          device.setTotalMemory(properties.totalMemory);
          device.initStreamPriorities().setLeast(priorities[i].least);
          device.getStreamPriorities().setGreatest(priorities[i].greatest);
          auto attributes =
              device.initAttributes(static_cast<unsigned>(properties.attributes.size()));
          for (unsigned a = 0; a < properties.attributes.size(); ++a) {
            attributes[a].setAttribute(properties.attributes[a].first);
            attributes[a].setValue(properties.attributes[a].second);
          }
        }
      });
}

}  // namespace gpuproxy::server
