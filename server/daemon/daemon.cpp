#include "server/daemon/daemon.hpp"

#include "ipc/unix_socket.hpp"
#include "server/admin/admin_service.hpp"
#include "server/backend/backend_select.hpp"
#include "server/session/client_session.hpp"
#include "server/session/server_state.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <stdexcept>

namespace gpuproxy::server {

namespace {

// Module images (PTX, fatbins) can be large; everything else is small. A client that sends more
// than this in one message is cut off.
constexpr std::uint64_t kMaxMessageWords = (256ull << 20) / sizeof(capnp::word);

// How long shutdown waits for clients' in-flight GPU work before freeing regardless.
constexpr auto kShutdownGrace = 5 * kj::SECONDS;

// One accepted connection: its stream and the RPC system serving its bootstrap capability.
struct RpcConnection {
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap)
      : stream_(kj::mv(stream)),
        network_(*stream_, capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}

  static capnp::ReaderOptions readerOptions() {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kMaxMessageWords;
    return options;
  }

  kj::Own<kj::AsyncIoStream> stream_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
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

// Accepts connections forever; each gets a fresh bootstrap from `makeBootstrap(peer)`.
template <typename MakeBootstrap>
kj::Promise<void> acceptLoop(kj::ConnectionReceiver& listener, kj::TaskSet& connections,
                             MakeBootstrap& makeBootstrap) {
  return listener.accept().then(
      [&listener, &connections, &makeBootstrap](kj::Own<kj::AsyncIoStream> stream) {
        KJ_IF_MAYBE (fd, stream->getFd()) {
          try {
            ipc::PeerCredentials peer = ipc::peerCredentials(*fd);
            auto connection = kj::heap<RpcConnection>(kj::mv(stream), makeBootstrap(peer));
            auto disconnected = connection->network_.onDisconnect();
            connections.add(disconnected.attach(kj::mv(connection)));
          } catch (const std::exception& error) {
            spdlog::warn("refusing a connection: {}", error.what());
          }
        }
        return acceptLoop(listener, connections, makeBootstrap);
      });
}

spdlog::level::level_enum logLevelOf(const std::string& name) {
  return spdlog::level::from_str(name);
}

kj::Own<kj::ConnectionReceiver> listenOn(kj::AsyncIoContext& io, const std::string& path,
                                         mode_t mode) {
  ipc::prepareListeningPath(path);
  auto address =
      io.provider->getNetwork().parseAddress(kj::str("unix:", path.c_str())).wait(io.waitScope);
  auto listener = address->listen();
  // The client socket is reachable by whoever can reach the path (access is granted by mounting
  // the directory into a pod); the admin socket only by its owner.
  if (::chmod(path.c_str(), mode) != 0) {
    throw std::runtime_error("cannot set permissions on '" + path + "'");
  }
  return listener;
}

}  // namespace

int runDaemon(const DaemonOptions& options) {
  auto logger = spdlog::stderr_color_mt("gpuproxyd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(logLevelOf(options.logLevel));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ gpuproxyd: %v");

  // Signals are delivered through the event loop; they must be captured before any thread starts.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
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
  state.driverVersion = choice.backend->driverVersion();
  spdlog::info("backend {}: {}", state.backendName, choice.reason);
  for (int i = 0; i < choice.backend->deviceCount(); ++i) {
    auto device = choice.backend->openDevice(i);
    if (!device.ok()) {
      spdlog::critical("cannot open device {} (CUresult {})", i, static_cast<int>(device.code()));
      return 1;
    }
    state.gpus.push_back(
        std::make_unique<GpuWorker>(static_cast<std::uint32_t>(i), std::move(device).value()));
    const auto& properties = state.gpus.back()->properties();
    spdlog::info("device {}: {}, {} bytes", i, properties.name, properties.totalMemory);
  }

  kj::TaskSet reaper(reaperErrors);
  state.reaper = &reaper;
  kj::Own<kj::ConnectionReceiver> clientListener;
  kj::Own<kj::ConnectionReceiver> adminListener;
  try {
    clientListener = listenOn(io, options.socketPath, 0666);
    adminListener = listenOn(io, options.adminSocketPath, 0600);
  } catch (const std::exception& error) {
    spdlog::critical("{}", error.what());
    return 1;
  } catch (const kj::Exception& error) {
    spdlog::critical("cannot listen: {}", error.getDescription().cStr());
    return 1;
  }

  int exitCode = 0;
  {
    kj::TaskSet connections(connectionErrors);
    auto clientBootstrap = [&state](ipc::PeerCredentials peer) -> capnp::Capability::Client {
      return kj::heap<ClientGateway>(state, peer);
    };
    auto adminBootstrap = [&state](ipc::PeerCredentials) -> capnp::Capability::Client {
      return kj::heap<AdminService>(state);
    };
    auto serving = acceptLoop(*clientListener, connections, clientBootstrap)
                       .exclusiveJoin(acceptLoop(*adminListener, connections, adminBootstrap))
                       .eagerlyEvaluate([](kj::Exception&& e) {
                         spdlog::critical("listener failed: {}", e.getDescription().cStr());
                       });
    spdlog::info("serving clients on {} and operators on {}", options.socketPath,
                 options.adminSocketPath);

    auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
    siginfo_t signal = stop.wait(io.waitScope);
    spdlog::info("signal {} received: shutting down", signal.si_signo);
    // Dropping the connections drops every session, which hands its GPU state to the reaper.
  }
  clientListener = nullptr;
  adminListener = nullptr;
  reaper.onEmpty()
      .exclusiveJoin(io.provider->getTimer().afterDelay(kShutdownGrace))
      .wait(io.waitScope);
  state.reaper = nullptr;
  ::unlink(options.socketPath.c_str());
  ::unlink(options.adminSocketPath.c_str());
  spdlog::info("stopped");
  return exitCode;
}

}  // namespace gpuproxy::server
