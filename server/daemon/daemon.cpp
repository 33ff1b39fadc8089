#include "server/daemon/daemon.hpp"

#include "ipc/unix_socket.hpp"
#include "protocol/cuda_result.hpp"
#include "protocol/limits.hpp"
#include "server/admin/admin_service.hpp"
#include "server/daemon/backend_select.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/metrics/metrics_server.hpp"
#include "server/session/client_session.hpp"
#include "server/session/server_state.hpp"
#include "server/tenant/tenant_config.hpp"

#include <capnp/rpc-twoparty.h>
#include <fcntl.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

namespace gpuproxy::server {

namespace {

constexpr std::uint64_t kMaxMessageWords = protocol::kMaxControlMessageBytes / sizeof(capnp::word);

// How long shutdown waits for clients' in-flight GPU work before freeing regardless.
constexpr auto kShutdownGrace = 5 * kj::SECONDS;

// Linux >= 6.5 hands out a pidfd of the peer that connected (not yet in Debian 12's headers).
constexpr int kSoPeerPidfd = 77;

// One accepted connection: its stream and the RPC system serving its bootstrap capability.
struct RpcConnection {
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap)
      : stream_(kj::mv(stream)),
        network_(*stream_, capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}
  // A client connection, which passes file descriptors (the data-plane segment).
  RpcConnection(kj::Own<kj::AsyncCapabilityStream> stream, capnp::Capability::Client bootstrap)
      : capabilityStream_(kj::mv(stream)),
        network_(*capabilityStream_, protocol::kMaxFdsPerMessage,
                 capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}

  static capnp::ReaderOptions readerOptions() {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kMaxMessageWords;
    return options;
  }

  kj::Own<kj::AsyncIoStream> stream_;
  kj::Own<kj::AsyncCapabilityStream> capabilityStream_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
};

// The process that opened a connection, pinned with a pidfd: readable once that process has
// exited, whoever else still holds the socket (a child that inherited it, say). Watched through
// the data plane's poller (io_uring where available).
class PeerProcess {
public:
  PeerProcess(DataPlane& dataPlane, int socketFd, pid_t pid) : dataPlane_(dataPlane) {
    socklen_t length = sizeof(fd_);
    if (::getsockopt(socketFd, SOL_SOCKET, kSoPeerPidfd, &fd_, &length) != 0) {
      // Older kernels: open it by pid. The peer is connected to us right now, so its pid cannot
      // have been reused yet unless it already exited, which the pidfd then reports at once.
      fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    }
    if (fd_ < 0) {
      spdlog::warn("no pidfd for pid {} ({}): its session ends only when its socket closes", pid,
                   std::strerror(errno));
    }
  }
  ~PeerProcess() {
    if (fd_ >= 0) ::close(fd_);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // The descriptor stays open until this object is destroyed, which must come after the promise.
  kj::Promise<void> exited() {
    if (fd_ < 0) return kj::NEVER_DONE;
    return dataPlane_.whenReadable(fd_);
  }

private:
  DataPlane& dataPlane_;
  int fd_ = -1;
};

class LoggingErrorHandler final : public kj::TaskSet::ErrorHandler {
public:
  explicit LoggingErrorHandler(const char* what) : what_(what) {}
  // kj::TaskSet::ErrorHandler
  void taskFailed(kj::Exception&& exception) override {
    if (exception.getType() == kj::Exception::Type::DISCONNECTED) return;
    spdlog::warn("{}: {}", what_, exception.getDescription().cStr());
  }

private:
  const char* what_;
};

kj::Own<kj::ConnectionReceiver> listenOn(kj::AsyncIoContext& io, const std::string& path,
                                         mode_t mode) {
  ipc::prepareListeningPath(path);
  auto address =
      io.provider->getNetwork().parseAddress(kj::str("unix:", path.c_str())).wait(io.waitScope);
  auto listener = address->listen();
  // The client sockets are reachable by whoever can reach the path (access is granted by mounting
  // the tenant's directory into a pod); the admin socket only by its owner.
  if (::chmod(path.c_str(), mode) != 0) {
    throw std::runtime_error("cannot set permissions on '" + path + "'");
  }
  return listener;
}

// The daemon's sockets and their tenants, and what happens on each connection.
class Listeners {
public:
  Listeners(kj::AsyncIoContext& io, ServerState& state, kj::TaskSet& connections)
      : io_(io), state_(state), connections_(connections) {}

  ~Listeners() {
    for (auto& [name, listener] : tenants_) ::unlink(listener.path.c_str());
  }

  // Makes the tenants and their sockets what `config` says. All new sockets are opened before
  // anything changes, so a config whose socket cannot be opened leaves everything as it was.
  // Throws with the reason.
  void apply(const TenantConfig& config) {
    std::map<std::string, kj::Own<kj::ConnectionReceiver>> opened;
    try {
      for (const TenantDefinition& definition : config.tenants) {
        auto current = tenants_.find(definition.name);
        if (current != tenants_.end() && current->second.path == definition.socketPath) continue;
        bool takenByAnother = false;
        for (const auto& [name, listener] : tenants_) {
          if (listener.path == definition.socketPath && name != definition.name) {
            takenByAnother = true;
          }
        }
        if (takenByAnother) {
          throw std::runtime_error("socket " + definition.socketPath +
                                   " moves between tenants; give it a new path");
        }
        opened.emplace(definition.name, listenOn(io_, definition.socketPath, 0666));
      }
    } catch (...) {
      for (const TenantDefinition& definition : config.tenants) {
        if (opened.count(definition.name) != 0) ::unlink(definition.socketPath.c_str());
      }
      throw;
    }

    std::map<std::string, bool> keep;
    for (const TenantDefinition& definition : config.tenants) {
      keep[definition.name] = true;
      std::shared_ptr<Tenant>& tenant = state_.tenants[definition.name];
      if (!tenant) {
        tenant = std::make_shared<Tenant>(definition);
        spdlog::info("tenant '{}' serves {}", definition.name, definition.socketPath);
      } else {
        tenant->setLimits(definition.limits);
        tenant->setSocketPath(definition.socketPath);
      }
      if (auto socket = opened.find(definition.name); socket != opened.end()) {
        stop(definition.name);
        Listener& listener = tenants_[definition.name];
        listener.path = definition.socketPath;
        listener.receiver = kj::mv(socket->second);
        listener.loop =
            acceptLoop(*listener.receiver, tenant)
                .eagerlyEvaluate([path = definition.socketPath](kj::Exception&& e) {
                  spdlog::error("listening on {} failed: {}", path, e.getDescription().cStr());
                });
      }
    }
    for (auto it = state_.tenants.begin(); it != state_.tenants.end();) {
      if (keep.count(it->first) != 0) {
        ++it;
        continue;
      }
      spdlog::info("tenant '{}' removed; its {} client(s) keep running until they exit", it->first,
                   it->second->clients);
      stop(it->first);
      it = state_.tenants.erase(it);
    }
  }

private:
  struct Listener {
    std::string path;
    kj::Own<kj::ConnectionReceiver> receiver;
    kj::Promise<void> loop = nullptr;
  };

  void stop(const std::string& tenant) {
    auto found = tenants_.find(tenant);
    if (found == tenants_.end()) return;
    found->second.loop = nullptr;
    found->second.receiver = nullptr;
    ::unlink(found->second.path.c_str());
    tenants_.erase(found);
  }

  kj::Promise<void> acceptLoop(kj::ConnectionReceiver& receiver, std::shared_ptr<Tenant> tenant) {
    return receiver.accept().then(
        [this, &receiver, tenant](kj::Own<kj::AsyncIoStream> stream) mutable {
          serve(kj::mv(stream), tenant);
          return acceptLoop(receiver, kj::mv(tenant));
        });
  }

  void serve(kj::Own<kj::AsyncIoStream> stream, const std::shared_ptr<Tenant>& tenant) {
    KJ_IF_MAYBE (fd, stream->getFd()) {
      try {
        ipc::PeerCredentials peer = ipc::peerCredentials(*fd);
        auto process = kj::heap<PeerProcess>(*state_.dataPlane, *fd, peer.pid);
        // The same socket, re-wrapped so that Cap'n Proto can attach descriptors to messages.
        const int duplicate = ::fcntl(*fd, F_DUPFD_CLOEXEC, 0);
        if (duplicate < 0) throw std::runtime_error(std::string("dup: ") + std::strerror(errno));
        auto socket = io_.lowLevelProvider->wrapUnixSocketFd(
            duplicate, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                           kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC);
        stream = nullptr;
        auto registration = state_.connections.add(peer.pid);
        std::uint64_t id = registration.id;
        auto connection = kj::heap<RpcConnection>(
            kj::mv(socket), kj::heap<ClientGateway>(state_, peer, tenant, id));
        ServerState& state = state_;
        // Whichever comes first ends the connection and with it the client's sessions: the
        // socket hanging up, the process exiting, or an operator's eviction.
        auto ended = connection->network_.onDisconnect()
                         .exclusiveJoin(process->exited())
                         .exclusiveJoin(kj::mv(registration.endRequested));
        connections_.add(ended.attach(kj::mv(connection), kj::mv(process),
                                      kj::defer([&state, id]() { state.connections.forget(id); })));
      } catch (const std::exception& error) {
        spdlog::warn("refusing a connection: {}", error.what());
      }
    }
  }

  kj::AsyncIoContext& io_;
  ServerState& state_;
  kj::TaskSet& connections_;
  std::map<std::string, Listener> tenants_;
};

kj::Promise<void> acceptAdmins(kj::ConnectionReceiver& receiver, ServerState& state,
                               kj::TaskSet& connections) {
  return receiver.accept().then(
      [&receiver, &state, &connections](kj::Own<kj::AsyncIoStream> stream) {
        auto connection = kj::heap<RpcConnection>(kj::mv(stream), kj::heap<AdminService>(state));
        auto disconnected = connection->network_.onDisconnect();
        connections.add(disconnected.attach(kj::mv(connection)));
        return acceptAdmins(receiver, state, connections);
      });
}

TenantConfig readConfig(const DaemonOptions& options, std::uint32_t deviceCount) {
  if (options.configPath.empty()) return defaultTenantConfig(options.socketPath);
  return loadTenantConfig(options.configPath, options.socketPath, deviceCount);
}

kj::Promise<void> reloadOnHangup(kj::AsyncIoContext& io, const DaemonOptions& options,
                                 ServerState& state, Listeners& listeners) {
  return io.unixEventPort.onSignal(SIGHUP).then([&](siginfo_t) {
    if (options.configPath.empty()) {
      spdlog::info("SIGHUP: no --config to reload");
    } else {
      try {
        listeners.apply(readConfig(options, static_cast<std::uint32_t>(state.gpus.size())));
        for (auto& gpu : state.gpus) gpu->dispatcher().refreshTenants();
        spdlog::info("SIGHUP: reloaded {}", options.configPath);
      } catch (const std::exception& error) {
        spdlog::error("SIGHUP: keeping the running configuration: {}", error.what());
      }
    }
    return reloadOnHangup(io, options, state, listeners);
  });
}

}  // namespace

int runDaemon(const DaemonOptions& options) {
  auto logger = spdlog::stderr_color_mt("gpuproxyd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(options.logLevel));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ gpuproxyd: %v");

  // Signals are delivered through the event loop; they must be captured before any thread starts.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::UnixEventPort::captureSignal(SIGHUP);
  std::signal(SIGPIPE, SIG_IGN);

  // Tells a gpuproxy stub that the loader might hand us in place of the driver that it is inside
  // the daemon (see client/stub/runtime.cpp).
  ::setenv("GPUPROXY_INSIDE_DAEMON", "1", 1);
  backend::BackendChoice choice;
  try {
    choice = backend::selectBackend(options.backend, options.simDevices, options.simMemoryBytes);
  } catch (const std::exception& error) {
    spdlog::critical("cannot start the {} backend: {}", options.backend, error.what());
    return 1;
  }
  if (!choice.backend) {
    spdlog::critical("{}", choice.reason);
    return 1;
  }
  LoggingErrorHandler connectionErrors("connection");
  LoggingErrorHandler reaperErrors("reclaim");
  auto io = kj::setupAsyncIo();

  ServerState state;
  state.backendName = std::string(choice.backend->name());
  dispatch::DispatchOptions dispatchOptions;
  dispatchOptions.name = options.scheduler;
  state.schedulerName = options.scheduler;
  spdlog::info("scheduler {}", options.scheduler);
  state.driverVersion = choice.backend->driverVersion();
  spdlog::info("backend {}: {}", state.backendName, choice.reason);
  backend::DeviceOptions deviceOptions;
  deviceOptions.bestEffortSms = options.bestEffortSms;
  deviceOptions.bestEffortPercent = options.bestEffortPercent;
  if (deviceOptions.wantsSmPartition() && state.backendName != "cuda") {
    spdlog::critical(
        "--best-effort-sms needs the cuda backend (green contexts); the {} backend runs one "
        "kernel at a time and has no SMs to partition",
        state.backendName);
    return 1;
  }
  for (int i = 0; i < choice.backend->deviceCount(); ++i) {
    auto device = choice.backend->openDevice(i, deviceOptions);
    if (!device.ok()) {
      spdlog::critical("cannot open device {}: {}{}", i,
                       protocol::cudaResultNameOr(device.code(), "unknown error"),
                       deviceOptions.wantsSmPartition()
                           ? " (with --best-effort-sms: the log above says why)"
                           : "");
      return 1;
    }
    state.gpus.push_back(std::make_unique<GpuWorker>(static_cast<std::uint32_t>(i),
                                                     std::move(device).value(),
                                                     io.provider->getTimer(), dispatchOptions));
    const auto& properties = state.gpus.back()->properties();
    spdlog::info("device {}: {}, {} bytes", i, properties.name, properties.totalMemory);
  }

  TenantConfig config;
  try {
    config = readConfig(options, static_cast<std::uint32_t>(state.gpus.size()));
  } catch (const std::exception& error) {
    spdlog::critical("{}", error.what());
    return 1;
  }

  kj::TaskSet reaper(reaperErrors);
  state.reaper = &reaper;
  DataPlaneOptions dataPlaneOptions;
  dataPlaneOptions.poller = options.poller == "io_uring" ? ipc::PollerBackend::kIoUring
                            : options.poller == "epoll"  ? ipc::PollerBackend::kEpoll
                                                         : ipc::PollerBackend::kAuto;
  std::optional<DataPlane> dataPlaneStorage;
  try {
    dataPlaneStorage.emplace(io.unixEventPort, dataPlaneOptions);
  } catch (const std::exception& error) {
    spdlog::critical("cannot start the data plane ({} poller): {}", options.poller, error.what());
    return 1;
  }
  DataPlane& dataPlane = *dataPlaneStorage;
  state.dataPlane = &dataPlane;
  // The data plane keeps the event queue non-empty while it spins; look at sockets and signals
  // every few turns anyway, so control calls are not starved by a busy client.
  io.waitScope.setBusyPollInterval(4);
  auto dataPlaneLoop = dataPlane.run().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::critical("data-plane loop failed: {}", e.getDescription().cStr());
  });
  int exitCode = 0;
  {
    kj::TaskSet connections(connectionErrors);
    Listeners listeners(io, state, connections);
    kj::Own<kj::ConnectionReceiver> adminListener;
    std::unique_ptr<MetricsServer> metrics;
    try {
      listeners.apply(config);
      adminListener = listenOn(io, options.adminSocketPath, 0600);
      if (!options.metricsAddress.empty()) {
        metrics = std::make_unique<MetricsServer>(
            io.provider->getNetwork(), io.provider->getTimer(), options.metricsAddress,
            [&state](protocol::DaemonStatus::Builder status) { fillDaemonStatus(state, status); });
        metrics->start(io.waitScope);
      }
    } catch (const std::exception& error) {
      spdlog::critical("{}", error.what());
      return 1;
    } catch (const kj::Exception& error) {
      spdlog::critical("cannot listen: {}", error.getDescription().cStr());
      return 1;
    }
    auto admins = acceptAdmins(*adminListener, state, connections).eagerlyEvaluate([](auto&& e) {
      spdlog::critical("admin listener failed: {}", e.getDescription().cStr());
    });
    auto reloads = reloadOnHangup(io, options, state, listeners).eagerlyEvaluate(nullptr);
    spdlog::info("serving clients on {} and operators on {}", options.socketPath,
                 options.adminSocketPath);
    // Declared after `metrics`, so it is dropped first, as MetricsServer::listen() requires.
    kj::Promise<void> metricsServing = kj::READY_NOW;
    if (metrics) {
      metricsServing = metrics->listen().eagerlyEvaluate([](kj::Exception&& e) {
        spdlog::error("metrics endpoint failed: {}", e.getDescription().cStr());
      });
      spdlog::info("serving metrics on {}", metrics->url());
    }

    auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
    siginfo_t signal = stop.wait(io.waitScope);
    spdlog::info("signal {} received: shutting down", signal.si_signo);
    ::unlink(options.adminSocketPath.c_str());
    // Leaving this scope drops every connection (so every session, whose GPU state goes to the
    // reaper) and closes and removes every socket.
  }
  reaper.onEmpty()
      .exclusiveJoin(io.provider->getTimer().afterDelay(kShutdownGrace))
      .wait(io.waitScope);
  state.reaper = nullptr;
  state.dataPlane = nullptr;
  spdlog::info("stopped");
  return exitCode;
}

}  // namespace gpuproxy::server
