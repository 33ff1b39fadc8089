#include "server/daemon/daemon.hpp"

#include "protocol/cuda_result.hpp"
#include "protocol/limits.hpp"
#include "server/admin/admin_service.hpp"
#include "server/daemon/backend_select.hpp"
#include "server/daemon/gpu_thread.hpp"
#include "server/daemon/rpc_connection.hpp"
#include "server/daemon/runtime_tenant_state.hpp"
#include "server/daemon/tenant_sockets.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/metrics/metrics_server.hpp"
#include "server/session/session_services.hpp"
#include "server/tenant/tenant_config.hpp"

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>

namespace gpuproxy::server {

namespace {

// How long shutdown waits for clients' in-flight GPU work before freeing regardless.
constexpr auto kShutdownGrace = 5 * kj::SECONDS;

// Descriptors the daemon keeps for itself (GPUs, the admin socket, logs, metrics) before it
// counts what is left for clients.
constexpr rlim_t kReservedDescriptors = 64;
// What one client connection can hold at most: its socket, the pidfd that watches its process and
// its data plane's segment, plus a doorbell per GPU (defaultConnectionsPerTenant).
constexpr rlim_t kDescriptorsPerConnectionBesidesDoorbells = 3;
// The default per-tenant connection limit lets one tenant take at most this fraction of the
// descriptors left for clients, so that a tenant that floods the daemon with connections cannot
// take them all.
constexpr rlim_t kTenantShareOfDescriptors = 4;
constexpr rlim_t kMaxDefaultConnectionsPerTenant = 1024;

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

// Raises the soft descriptor limit to the hard one (every connection costs descriptors) and
// returns the limit the daemon then runs with.
rlim_t raiseDescriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    } else {
      spdlog::warn("cannot raise the descriptor limit from {} to {}: {}", limit.rlim_cur,
                   limit.rlim_max, std::strerror(errno));
    }
  }
  return limit.rlim_cur;
}

std::uint32_t defaultConnectionsPerTenant(rlim_t descriptors, std::size_t gpus) {
  const rlim_t forClients =
      descriptors > 2 * kReservedDescriptors ? descriptors - kReservedDescriptors : descriptors / 2;
  const rlim_t perConnection =
      kDescriptorsPerConnectionBesidesDoorbells + std::max<rlim_t>(1, static_cast<rlim_t>(gpus));
  const rlim_t share = forClients / perConnection / kTenantShareOfDescriptors;
  return static_cast<std::uint32_t>(std::clamp<rlim_t>(share, 1, kMaxDefaultConnectionsPerTenant));
}

kj::Promise<void> acceptAdmins(kj::ConnectionReceiver& receiver, AdminView view,
                               TenantControl& tenants, kj::TaskSet& connections) {
  return receiver.accept().then(
      [&receiver, view, &tenants, &connections](kj::Own<kj::AsyncIoStream> stream) {
        auto connection =
            kj::heap<RpcConnection>(kj::mv(stream), kj::heap<AdminService>(view, tenants));
        auto disconnected = connection->network_.onDisconnect();
        connections.add(disconnected.attach(kj::mv(connection)));
        return acceptAdmins(receiver, view, tenants, connections);
      });
}

TenantConfig readConfig(const DaemonOptions& options, std::uint32_t deviceCount) {
  if (options.configPath.empty()) return defaultTenantConfig(options.socketPath);
  return loadTenantConfig(options.configPath, options.socketPath, deviceCount);
}

kj::Promise<void> reloadOnHangup(kj::AsyncIoContext& io, const DaemonOptions& options,
                                 const Gpus& gpus, TenantSockets& sockets) {
  return io.unixEventPort.onSignal(SIGHUP).then([&](siginfo_t) {
    if (options.configPath.empty()) {
      spdlog::info("SIGHUP: no --config to reload");
    } else {
      try {
        sockets.applyConfig(readConfig(options, static_cast<std::uint32_t>(gpus.size())));
        refreshTenantsOnEveryGpu(gpus);
        spdlog::info("SIGHUP: reloaded {}", options.configPath);
      } catch (const std::exception& error) {
        spdlog::error("SIGHUP: keeping the running configuration: {}", error.what());
      }
    }
    return reloadOnHangup(io, options, gpus, sockets);
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

  const rlim_t descriptors = raiseDescriptorLimit();

  // Tells a gpuproxy stub that the loader might hand us in place of the driver that it is inside
  // the daemon (see client/stub/runtime.cpp).
  // Unless the operator named the library to load: then a stub is meant (a chained daemon).
  if (options.cudaDriver.empty()) ::setenv("GPUPROXY_INSIDE_DAEMON", "1", 1);
  backend::BackendChoice choice;
  try {
    sim::SimOptions simulator;
    simulator.devices = options.simDevices;
    simulator.memoryBytes = options.simMemoryBytes;
    simulator.computeCapability = options.simComputeCapability;
    simulator.slowModuleLoad = options.simSlowModuleLoad;
    simulator.slowFree = options.simSlowFree;
    simulator.slowReset = options.simSlowReset;
    choice = backend::selectBackend(options.backend, simulator, options.cudaDriver);
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

  // The daemon's state, each piece owned here and lent to the parts that use it (SessionServices,
  // AdminView): nothing reaches into one bag of everything.
  DaemonFacts facts;
  facts.backendName = std::string(choice.backend->name());
  dispatch::DispatchOptions dispatchOptions;
  dispatchOptions.name = options.scheduler;
  facts.schedulerName = options.scheduler;
  spdlog::info("scheduler {}", options.scheduler);
  facts.driverVersion = choice.backend->driverVersion();
  spdlog::info("backend {}: {}", facts.backendName, choice.reason);
  Gpus gpus;
  std::set<ClientSession*> sessions;
  TenantRegistry tenants;
  ConnectionRegistry connectionRegistry;
  backend::DeviceOptions deviceOptions;
  deviceOptions.bestEffortSms = options.bestEffortSms;
  deviceOptions.bestEffortPercent = options.bestEffortPercent;
  if (deviceOptions.wantsSmPartition() && facts.backendName != "cuda") {
    spdlog::critical(
        "--best-effort-sms needs the cuda backend (green contexts); the {} backend runs one "
        "kernel at a time and has no SMs to partition",
        facts.backendName);
    return 1;
  }
  DataPlaneOptions dataPlaneOptions;
  dataPlaneOptions.poller = options.poller == "io_uring" ? ipc::PollerBackend::kIoUring
                            : options.poller == "epoll"  ? ipc::PollerBackend::kEpoll
                                                         : ipc::PollerBackend::kAuto;
  // Each GPU is opened and served by a thread of its own (GpuThread), which owns its state and
  // reads its ring of every client; everything else reaches it by message.
  GpuThread::Options gpuOptions;
  gpuOptions.device = deviceOptions;
  gpuOptions.dispatch = dispatchOptions;
  gpuOptions.dataPlane = dataPlaneOptions;
  std::vector<std::unique_ptr<GpuThread>> gpuThreads;
  std::vector<DataPlane*> gpuDataPlanes;
  for (int i = 0; i < choice.backend->deviceCount(); ++i) {
    backend::Result<std::unique_ptr<GpuThread>> started = CUDA_ERROR_UNKNOWN;
    try {
      started = GpuThread::start(*choice.backend, static_cast<std::uint32_t>(i), gpuOptions);
    } catch (const std::exception& error) {
      spdlog::critical("cannot serve device {} ({} poller): {}", i, options.poller, error.what());
      return 1;
    }
    if (!started.ok()) {
      spdlog::critical("cannot open device {}: {}{}", i,
                       protocol::cudaResultNameOr(started.code(), "unknown error"),
                       deviceOptions.wantsSmPartition()
                           ? " (with --best-effort-sms: the log above says why)"
                           : "");
      return 1;
    }
    gpuThreads.push_back(std::move(started).value());
    gpus.push_back(&gpuThreads.back()->shard());
    gpuDataPlanes.push_back(&gpuThreads.back()->dataPlane());
    const auto& properties = gpus.back()->properties();
    spdlog::info("device {}: {}, {} bytes, compute capability {}", i, properties.name,
                 properties.totalMemory,
                 backend::computeCapabilityName(properties.computeCapability()));
  }

  // A client's data plane holds a doorbell per GPU, so the default share depends on how many.
  ConnectionPolicy connectionPolicy;
  connectionPolicy.maxConnectionsPerTenant =
      options.maxConnectionsPerTenant != 0 ? options.maxConnectionsPerTenant
                                           : defaultConnectionsPerTenant(descriptors, gpus.size());
  connectionPolicy.reservedPaths = {options.adminSocketPath};
  spdlog::info("descriptor limit {}: at most {} connections per tenant unless its own limit says",
               descriptors, connectionPolicy.maxConnectionsPerTenant);

  TenantConfig config;
  try {
    config = readConfig(options, static_cast<std::uint32_t>(gpus.size()));
  } catch (const std::exception& error) {
    spdlog::critical("{}", error.what());
    return 1;
  }

  kj::TaskSet reaper(reaperErrors);
  std::optional<DataPlane> dataPlaneStorage;
  try {
    dataPlaneStorage.emplace(io.unixEventPort, io.provider->getTimer(), dataPlaneOptions);
  } catch (const std::exception& error) {
    spdlog::critical("cannot start the data plane ({} poller): {}", options.poller, error.what());
    return 1;
  }
  DataPlane& dataPlane = *dataPlaneStorage;
  const SessionServices sessionServices{facts,  gpus,       sessions,     connectionRegistry,
                                        reaper, &dataPlane, gpuDataPlanes};
  const AdminView adminView{facts, gpus, sessions, tenants, connectionRegistry};
  io.waitScope.setBusyPollInterval(kDataPlaneBusyPollInterval);
  auto dataPlaneLoop = dataPlane.run().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::critical("data-plane loop failed: {}", e.getDescription().cStr());
  });
  int exitCode = 0;
  {
    kj::TaskSet connections(connectionErrors);
    TenantPersistence persistence;
    if (!options.stateDirectory.empty()) {
      std::error_code error;
      std::filesystem::create_directories(options.stateDirectory, error);
      if (error) {
        spdlog::critical("--state-dir {}: {}", options.stateDirectory, error.message());
        return 1;
      }
      persistence.stateFile =
          (std::filesystem::path(options.stateDirectory) / kRuntimeTenantsFile).string();
    }
    TenantSockets sockets(io, sessionServices, tenants, connections, connectionPolicy, persistence);
    UnixListener adminListener;
    std::unique_ptr<MetricsServer> metrics;
    try {
      sockets.applyConfig(config);
      sockets.restoreRuntimeTenants();
      adminListener = listenUnix(io, options.adminSocketPath, 0600);
      if (!options.metricsAddress.empty()) {
        metrics = std::make_unique<MetricsServer>(
            io.provider->getNetwork(), io.provider->getTimer(), options.metricsAddress,
            [&adminView, &sockets](protocol::DaemonStatus::Builder status) {
              return fillDaemonStatus(adminView, status, &sockets);
            });
        metrics->start(io.waitScope);
      }
    } catch (const std::exception& error) {
      spdlog::critical("{}", error.what());
      return 1;
    } catch (const kj::Exception& error) {
      spdlog::critical("cannot listen: {}", error.getDescription().cStr());
      return 1;
    }
    auto admins = acceptAdmins(*adminListener.receiver, adminView, sockets, connections)
                      .eagerlyEvaluate([](auto&& e) {
                        spdlog::critical("admin listener failed: {}", e.getDescription().cStr());
                      });
    auto reloads = reloadOnHangup(io, options, gpus, sockets).eagerlyEvaluate(nullptr);
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
    admins = nullptr;  // borrows the receiver
    adminListener.receiver = nullptr;
    adminListener.socket.withdraw();
    // Leaving this scope drops every connection (so every session, whose GPU state goes to the
    // reaper) and closes and removes every socket.
  }
  // A dropped connection cancels its calls on later turns of the event loop, and a call in flight
  // holds its session until then; a session's teardown in turn feeds the reaper. Turn the loop
  // until both are done: everything below (the data plane, the GPUs) outlives every session.
  kj::Timer& timer = io.provider->getTimer();
  const kj::TimePoint deadline = timer.now() + kShutdownGrace;
  while ((!sessions.empty() || !reaper.isEmpty()) && timer.now() < deadline) {
    timer.afterDelay(1 * kj::MILLISECONDS).wait(io.waitScope);
  }
  if (!sessions.empty()) {
    // A session still held by a call that would not end: its teardown would reach state that is
    // about to go. The process ends here; the kernel takes back what it held.
    spdlog::warn("{} client session(s) still busy after {} s; exiting without their teardown",
                 sessions.size(), kShutdownGrace / kj::SECONDS);
    spdlog::shutdown();
    std::_Exit(exitCode);
  }
  spdlog::info("stopped");
  return exitCode;
}

}  // namespace gpuproxy::server
