#include "server/daemon/tenant_sockets.hpp"
#include "server/daemon/runtime_tenant_state.hpp"

#include "server/data_plane/data_plane.hpp"
#include "server/session/client_session.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace gpuproxy::server {

namespace {

// Linux >= 6.5 hands out a pidfd of the peer that connected (not yet in Debian 12's headers).
constexpr int kSoPeerPidfd = 77;

// How long a listener waits before accepting again after accept() failed (out of descriptors,
// say): the listener keeps serving once descriptors are free again instead of dying.
constexpr auto kAcceptRetryDelay = 100 * kj::MILLISECONDS;

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

  // False once the process has exited: what was read about it by pid may then describe another
  // process that reused the pid.
  bool alive() const {
    if (fd_ < 0) return true;  // cannot tell; the caller read what it could
    pollfd poll{fd_, POLLIN, 0};
    return ::poll(&poll, 1, 0) == 0;
  }

  // The descriptor stays open until this object is destroyed, which must come after the promise.
  kj::Promise<void> exited() {
    if (fd_ < 0) return kj::NEVER_DONE;
    return dataPlane_.whenReadable(fd_);
  }

private:
  DataPlane& dataPlane_;
  int fd_ = -1;
};

// A run-time tenant's socket directory: absolute, and naming itself plainly, so that what the
// admin asked for is where the socket lands.
void checkSocketDirectory(const std::string& directory) {
  if (directory.empty() || directory.front() != '/') {
    throw TenantError("socket directory '" + directory + "' is not an absolute path");
  }
  for (const auto& part : std::filesystem::path(directory)) {
    if (part == "." || part == "..") {
      throw TenantError("socket directory '" + directory + "' contains '.' or '..'");
    }
  }
}

}  // namespace

TenantSockets::TenantSockets(kj::AsyncIoContext& io, SessionServices sessions,
                             TenantRegistry& tenants, kj::TaskSet& connections,
                             ConnectionPolicy policy, TenantPersistence persistence)
    : io_(io),
      sessions_(sessions),
      tenants_(tenants),
      connections_(connections),
      policy_(std::move(policy)),
      persistence_(std::move(persistence)) {}

TenantSockets::~TenantSockets() {
  if (persistence_.stateFile.empty()) return;
  // The next daemon serves these tenants again, in these directories, which pods hold mounted:
  // a directory made anew would be another one than theirs.
  for (auto& [id, listener] : listeners_) {
    std::shared_ptr<Tenant> tenant = tenants_.find(id);
    if (tenant && tenant->origin() == TenantOrigin::kRuntime) {
      listener.listening.socket.keepDirectories();
    }
  }
}

void TenantSockets::tenantChanged(const Tenant& tenant) {
  if (tenant.origin() == TenantOrigin::kRuntime) saveRuntimeTenants();
}

void TenantSockets::saveRuntimeTenants() {
  if (persistence_.stateFile.empty()) return;
  std::vector<SavedTenant> saved;
  for (const auto& [name, tenant] : tenants_.byName()) {
    if (tenant->origin() != TenantOrigin::kRuntime) continue;
    TenantDefinition definition{tenant->name(),
                                std::filesystem::path(tenant->socketPath()).parent_path().string(),
                                tenant->limits(), TenantOrigin::kRuntime, tenant->allocation()};
    saved.push_back(SavedTenant{std::move(definition), tenant->boundPodUid(), tenant->pod()});
  }
  try {
    replaceFile(persistence_.stateFile, encodeRuntimeTenants(saved));
  } catch (const std::exception& error) {
    spdlog::error("cannot keep the run-time tenants for the next start: {}", error.what());
  }
}

void TenantSockets::restoreRuntimeTenants() {
  if (persistence_.stateFile.empty()) return;
  std::ifstream file(persistence_.stateFile);
  if (!file) return;  // none yet
  std::stringstream text;
  text << file.rdbuf();
  std::vector<SavedTenant> saved;
  try {
    saved = decodeRuntimeTenants(text.str());
  } catch (const std::exception& error) {
    spdlog::error("{}: {}; no run-time tenant is served again", persistence_.stateFile,
                  error.what());
    return;
  }
  for (SavedTenant& entry : saved) {
    const std::string name = entry.definition.name;
    try {
      std::shared_ptr<Tenant> tenant = makeRuntimeTenant(std::move(entry.definition));
      if (entry.boundPodUid) tenant->bindPodUid(*entry.boundPodUid);
      tenant->setPod(std::move(entry.pod));
      spdlog::info("tenant '{}' (id {}) served again from {}{}", name, tenant->id(),
                   persistence_.stateFile,
                   entry.boundPodUid ? ", bound to pod " + *entry.boundPodUid : "");
    } catch (const std::exception& error) {
      spdlog::error("run-time tenant '{}' is not served again: {}", name, error.what());
    }
  }
  saveRuntimeTenants();
}

std::uint32_t TenantSockets::maxConnections(const Tenant& tenant) const {
  return tenant.limits().maxConnections.value_or(policy_.maxConnectionsPerTenant);
}

void TenantSockets::checkPathIsFree(const std::string& path, TenantId owner) const {
  for (const std::string& reserved : policy_.reservedPaths) {
    if (reserved == path) throw std::runtime_error("socket " + path + " is the daemon's own");
  }
  for (const auto& [id, listener] : listeners_) {
    if (id != owner && listener.listening.socket.path() == path) {
      auto tenant = tenants_.find(id);
      throw std::runtime_error("socket " + path + " is tenant '" +
                               (tenant ? tenant->name() : std::string("?")) + "''s");
    }
  }
}

void TenantSockets::applyConfig(const TenantConfig& config) {
  // Everything that can fail happens before anything changes.
  std::set<std::string> listed;
  for (const TenantDefinition& definition : config.tenants) {
    listed.insert(definition.name);
    auto existing = tenants_.find(definition.name);
    if (existing && existing->origin() == TenantOrigin::kRuntime) {
      throw std::runtime_error("tenant '" + definition.name +
                               "' was created at run time; give the file's tenant another name");
    }
  }
  std::map<std::string, UnixListener> opened;  // by tenant name; withdrawn if we throw
  for (const TenantDefinition& definition : config.tenants) {
    auto existing = tenants_.find(definition.name);
    if (existing && existing->socketPath() == definition.socketPath) continue;
    // A path may pass from a tenant the file drops to a new one only through two reloads, so
    // that no client of the old tenant can be taken for one of the new.
    checkPathIsFree(definition.socketPath, existing ? existing->id() : 0);
    opened.emplace(definition.name, listenUnix(io_, definition.socketPath, 0666));
  }

  for (const TenantDefinition& definition : config.tenants) {
    std::shared_ptr<Tenant> tenant = tenants_.find(definition.name);
    if (!tenant) {
      TenantDefinition added = definition;
      added.origin = TenantOrigin::kConfig;
      tenant = tenants_.add(std::move(added));
      spdlog::info("tenant '{}' (id {}) serves {}", tenant->name(), tenant->id(),
                   definition.socketPath);
    } else {
      tenant->setLimits(definition.limits);
      if (tenant->socketPath() != definition.socketPath) {
        spdlog::info("tenant '{}' (id {}) moves to {}", tenant->name(), tenant->id(),
                     definition.socketPath);
      }
      tenant->setSocketPath(definition.socketPath);
    }
    if (auto socket = opened.find(definition.name); socket != opened.end()) {
      stop(tenant->id());
      start(tenant, std::move(socket->second));
    }
  }
  std::vector<std::string> dropped;
  for (const auto& [name, tenant] : tenants_.byName()) {
    if (tenant->origin() == TenantOrigin::kConfig && listed.count(name) == 0) {
      dropped.push_back(name);
    }
  }
  for (const std::string& name : dropped) {
    std::shared_ptr<Tenant> tenant = tenants_.remove(name);
    spdlog::info("tenant '{}' (id {}) removed; its {} client(s) keep running until they exit", name,
                 tenant->id(), tenant->clients);
    stop(tenant->id());
  }
}

std::shared_ptr<Tenant> TenantSockets::createTenant(TenantDefinition definition) {
  std::shared_ptr<Tenant> tenant = makeRuntimeTenant(std::move(definition));
  saveRuntimeTenants();
  return tenant;
}

std::shared_ptr<Tenant> TenantSockets::makeRuntimeTenant(TenantDefinition definition) {
  if (!isValidTenantName(definition.name)) {
    throw TenantError("tenant name '" + definition.name +
                      "' is not valid: letters, digits, '-', '_' and '.' (at most 64)");
  }
  if (tenants_.find(definition.name)) {
    throw TenantError("a tenant named '" + definition.name + "' exists");
  }
  checkSocketDirectory(definition.socketPath);
  std::string directory = definition.socketPath;
  while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
  const std::string path =
      (directory == "/" ? std::string() : directory) + "/" + std::string(kTenantSocketName);
  const TenantLimits& limits = definition.limits;
  if (limits.weight < 1 || limits.weight > kMaxTenantWeight) {
    throw TenantError("weight " + std::to_string(limits.weight) + " is not between 1 and " +
                      std::to_string(kMaxTenantWeight));
  }
  if (limits.maxConnections &&
      (*limits.maxConnections < 1 || *limits.maxConnections > kMaxTenantConnections)) {
    throw TenantError("max connections " + std::to_string(*limits.maxConnections) +
                      " is not between 1 and " + std::to_string(kMaxTenantConnections));
  }
  if (limits.devices) {
    if (limits.devices->empty()) throw TenantError("a tenant needs at least one device");
    std::set<std::uint32_t> seen;
    for (std::uint32_t device : *limits.devices) {
      if (device >= sessions_.gpus.size()) {
        throw TenantError("device " + std::to_string(device) + " does not exist (this node has " +
                          std::to_string(sessions_.gpus.size()) + ")");
      }
      if (!seen.insert(device).second) {
        throw TenantError("device " + std::to_string(device) + " is listed twice");
      }
    }
  }
  UnixListener listening;
  try {
    checkPathIsFree(path, 0);
    listening = listenUnix(io_, path, 0666);
  } catch (const std::exception& error) {
    throw TenantError(error.what());
  }
  definition.socketPath = path;
  definition.origin = TenantOrigin::kRuntime;
  std::shared_ptr<Tenant> tenant = tenants_.add(std::move(definition));
  start(tenant, std::move(listening));
  spdlog::info(
      "tenant '{}' (id {}) created: serves {}{}", tenant->name(), tenant->id(), path,
      tenant->allocation().empty() ? "" : " for an allocation of " + tenant->allocation().resource);
  return tenant;
}

std::uint32_t TenantSockets::removeTenant(std::string_view name) {
  std::shared_ptr<Tenant> tenant = tenants_.find(name);
  if (!tenant) throw TenantError("no tenant named '" + std::string(name) + "'");
  if (tenant->origin() != TenantOrigin::kRuntime) {
    throw TenantError("tenant '" + std::string(name) +
                      "' comes from the tenants file: remove it there and reload (SIGHUP)");
  }
  tenants_.remove(name);
  stop(tenant->id());
  const std::uint32_t ended = sessions_.connections.endTenant(tenant->id());
  spdlog::info("tenant '{}' (id {}) removed: socket closed, {} connection(s) ended", tenant->name(),
               tenant->id(), ended);
  saveRuntimeTenants();
  return ended;
}

void TenantSockets::start(const std::shared_ptr<Tenant>& tenant, UnixListener listening) {
  Listener& listener = listeners_[tenant->id()];
  listener.listening = std::move(listening);
  listener.loop =
      acceptLoop(listener, tenant)
          .eagerlyEvaluate([path = tenant->socketPath()](kj::Exception&& e) {
            spdlog::error("listening on {} failed: {}", path, e.getDescription().cStr());
          });
}

void TenantSockets::stop(TenantId tenant) {
  auto found = listeners_.find(tenant);
  if (found == listeners_.end()) return;
  found->second.loop = nullptr;
  listeners_.erase(found);  // closes the socket, then removes its file and the directories made
}

kj::Promise<void> TenantSockets::acceptLoop(Listener& listener, std::shared_ptr<Tenant> tenant) {
  return listener.listening.receiver->accept().then(
      [this, &listener, tenant](kj::Own<kj::AsyncIoStream> stream) mutable {
        serve(kj::mv(stream), tenant);
        return acceptLoop(listener, kj::mv(tenant));
      },
      [this, &listener, tenant](kj::Exception&& error) mutable {
        // Most likely out of descriptors: refuse nobody for good, try again shortly.
        logRefusal("accept:" + tenant->name(),
                   "tenant '" + tenant->name() +
                       "': cannot accept a connection: " + error.getDescription().cStr());
        return io_.provider->getTimer()
            .afterDelay(kAcceptRetryDelay)
            .then([this, &listener, tenant]() mutable {
              return acceptLoop(listener, kj::mv(tenant));
            });
      });
}

void TenantSockets::logRefusal(const std::string& reason, const std::string& message) {
  Refusals& refusals = refusals_[reason];
  const auto now = std::chrono::steady_clock::now();
  if (refusals.sinceLogged > 0 && now - refusals.lastLogged < std::chrono::seconds(1)) {
    ++refusals.sinceLogged;
    return;
  }
  if (refusals.sinceLogged > 1) {
    spdlog::warn("{} ({} more like it in the last second)", message, refusals.sinceLogged - 1);
  } else {
    spdlog::warn("{}", message);
  }
  refusals.lastLogged = now;
  refusals.sinceLogged = 1;
}

bool TenantSockets::admitPod(Tenant& tenant, pid_t pid, const PodIdentity& pod) {
  // Only an allocation's socket is bound to a pod: the directory was mounted into one pod's
  // containers, and a process of any other pod that reaches it got it where it should not.
  if (tenant.allocation().empty()) return true;
  switch (pod.kind) {
    case PodIdentity::Kind::kNone:
      // A process on the host, which reaches the path only with the host's file system.
      return true;
    case PodIdentity::Kind::kAmbiguous:
      logRefusal("pod:" + tenant.name(), "refusing pid " + std::to_string(pid) + " on tenant '" +
                                             tenant.name() +
                                             "': its cgroup names more than one pod");
      return false;
    case PodIdentity::Kind::kPod:
      break;
  }
  if (!tenant.boundPodUid()) {
    tenant.bindPodUid(pod.podUid);
    spdlog::info("tenant '{}' (id {}) is bound to pod {}: clients of other pods are refused",
                 tenant.name(), tenant.id(), pod.podUid);
    saveRuntimeTenants();
    return true;
  }
  if (*tenant.boundPodUid() == pod.podUid) return true;
  logRefusal("pod:" + tenant.name(),
             "refusing pid " + std::to_string(pid) + " of pod " + pod.podUid + " on tenant '" +
                 tenant.name() + "': its allocation belongs to pod " + *tenant.boundPodUid());
  return false;
}

void TenantSockets::serve(kj::Own<kj::AsyncIoStream> stream,
                          const std::shared_ptr<Tenant>& tenant) {
  KJ_IF_MAYBE (fd, stream->getFd()) {
    try {
      ipc::PeerCredentials peer = ipc::peerCredentials(*fd);
      if (peer.pid == 0) {
        // The peer lives in a PID namespace the daemon cannot see into: its process cannot be
        // watched or named, so it is not served.
        logRefusal("pid0", "refusing a connection to " + tenant->socketPath() +
                               ": the peer's pid is not visible here (gpuproxyd must run in the "
                               "host's PID namespace: hostPID)");
        return;
      }
      const std::uint32_t limit = maxConnections(*tenant);
      if (tenant->connections >= limit) {
        logRefusal("limit:" + tenant->name(),
                   "tenant '" + tenant->name() + "' has " + std::to_string(tenant->connections) +
                       " connections, its limit: refusing pid " + std::to_string(peer.pid));
        return;
      }
      auto process = kj::heap<PeerProcess>(*sessions_.dataPlane, *fd, peer.pid);
      PodIdentity pod = podIdentityFromCgroup(readCgroupFile(peer.pid));
      if (!process->alive()) return;  // gone: what was read may be another process's
      if (!admitPod(*tenant, peer.pid, pod)) return;
      // The same socket, re-wrapped so that Cap'n Proto can attach descriptors to messages.
      const int duplicate = ::fcntl(*fd, F_DUPFD_CLOEXEC, 0);
      if (duplicate < 0) throw std::runtime_error(std::string("dup: ") + std::strerror(errno));
      auto socket = io_.lowLevelProvider->wrapUnixSocketFd(
          duplicate, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                         kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC);
      stream = nullptr;
      auto registration = sessions_.connections.add(peer.pid, tenant->id());
      std::uint64_t id = registration.id;
      auto connection = kj::heap<RpcConnection>(
          kj::mv(socket), kj::heap<ClientGateway>(sessions_, peer, tenant, id, kj::mv(pod)));
      ++tenant->connections;
      ConnectionRegistry& registry = sessions_.connections;
      // Whichever comes first ends the connection and with it the client's session: the socket
      // hanging up, the process exiting, an operator's eviction or the tenant's removal.
      auto ended = connection->network_.onDisconnect()
                       .exclusiveJoin(process->exited())
                       .exclusiveJoin(kj::mv(registration.endRequested));
      connections_.add(
          ended.attach(kj::mv(connection), kj::mv(process), kj::defer([&registry, id, tenant]() {
                         registry.forget(id);
                         --tenant->connections;
                       })));
    } catch (const std::exception& error) {
      logRefusal("error", std::string("refusing a connection: ") + error.what());
    }
  }
}

}  // namespace gpuproxy::server
