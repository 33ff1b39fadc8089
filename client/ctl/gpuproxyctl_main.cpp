// gpuproxyctl: the operator's view of gpuproxyd, over the admin socket.
#include "client/ctl/status_report.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "protocol/byte_size.hpp"
#include "protocol/limits.hpp"

#include <capnp/ez-rpc.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using gpuproxy::protocol::Admin;

// Runs `body` against the daemon's admin interface; a daemon that cannot be reached is reported
// the same way by every command.
int withAdmin(const std::string& adminSocket,
              const std::function<int(Admin::Client&, kj::WaitScope&)>& body) {
  try {
    capnp::EzRpcClient client("unix:" + adminSocket);
    auto admin = client.getMain<Admin>();
    return body(admin, client.getWaitScope());
  } catch (const kj::Exception& error) {
    std::fprintf(stderr,
                 "gpuproxyctl: cannot reach gpuproxyd at %s: %s\n"
                 "gpuproxyctl: is the daemon running? (--admin-socket PATH chooses the socket)\n",
                 adminSocket.c_str(), error.getDescription().cStr());
    return 1;
  }
}

void printJson(const nlohmann::json& json) {
  std::printf("%s\n", json.dump(2).c_str());
}

// Reports the outcome of a command that changes something: `error` empty means it worked.
int report(bool json, const std::string& error, nlohmann::json details, const std::string& done) {
  if (json) {
    details["ok"] = error.empty();
    if (!error.empty()) details["error"] = error;
    printJson(details);
  } else if (error.empty()) {
    std::printf("%s\n", done.c_str());
  } else {
    std::fprintf(stderr, "gpuproxyctl: %s\n", error.c_str());
  }
  return error.empty() ? 0 : 1;
}

int usageError(const std::string& message) {
  std::fprintf(stderr, "gpuproxyctl: %s\n", message.c_str());
  return 2;
}

// A size option's value: nullopt for "none" (when allowed) or when not given; `error` says why a
// given value is not a size.
std::optional<std::uint64_t> sizeOption(const CLI::Option* option, const std::string& value,
                                        bool noneAllowed, std::string& error) {
  if (option->count() == 0 || (noneAllowed && value == "none")) return std::nullopt;
  auto bytes = gpuproxy::protocol::parseByteSize(value);
  if (!bytes) {
    error = option->get_name() + ": '" + value + "' is not a size (try 8GiB" +
            (noneAllowed ? ", or none)" : ")");
  }
  return bytes;
}

// Process ids Linux hands out: 1 to PID_MAX_LIMIT.
constexpr std::uint64_t kMaxPid = 4194304;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpuproxyctl: inspect and manage gpuproxyd"};
  std::string adminSocket = gpuproxy::protocol::kDefaultAdminSocket;
  app.add_option("--admin-socket", adminSocket, "gpuproxyd's admin socket")->capture_default_str();
  app.require_subcommand(1);
  bool json = false;

  auto* status = app.add_subcommand("status", "devices, tenants, clients and their use of GPUs");
  status->add_flag("--json", json, "machine-readable output");

  auto* tenants = app.add_subcommand("tenants", "tenants with their limits and use");
  tenants->add_flag("--json", json, "machine-readable output");

  auto* setLimit = app.add_subcommand("set-limit", "change a tenant's limits, effective at once");
  std::string tenantName;
  std::string memory;
  std::optional<std::uint32_t> weight;
  std::string tenantClass;
  std::string pinnedMemory;
  setLimit->add_option("tenant", tenantName, "tenant name")->required();
  auto* memoryOption =
      setLimit->add_option("--memory", memory, "memory limit per device, e.g. 8GiB, or 'none'");
  auto* pinnedOption = setLimit->add_option("--pinned-memory", pinnedMemory,
                                            "pinned host memory limit, e.g. 1GiB, or 'none'");
  setLimit->add_option("--weight", weight, "best-effort share (1-10000)");
  setLimit->add_option("--class", tenantClass, "best-effort or latency-critical")
      ->check(CLI::IsMember({"best-effort", "latency-critical"}));
  setLimit->add_flag("--json", json, "machine-readable output");

  auto* evict = app.add_subcommand("evict", "end a client's session and reclaim what it held");
  std::uint64_t pid = 0;
  evict->add_option("pid", pid, "the client's process id")->required();
  evict->add_flag("--json", json, "machine-readable output");

  auto* createTenant = app.add_subcommand(
      "create-tenant", "create a tenant now, listening on DIR/gpuproxy.sock (DIR is created)");
  std::string socketDirectory;
  std::string devices;
  std::uint32_t maxConnections = 0;
  createTenant->add_option("tenant", tenantName, "tenant name")->required();
  createTenant->add_option("--socket-dir", socketDirectory, "directory of the tenant's socket")
      ->required();
  auto* createMemory =
      createTenant->add_option("--memory", memory, "memory limit per device, e.g. 8GiB");
  auto* createPinned =
      createTenant->add_option("--pinned-memory", pinnedMemory, "pinned host memory limit");
  createTenant->add_option("--weight", weight, "best-effort share (1-10000, default 1)");
  createTenant->add_option("--class", tenantClass, "best-effort (default) or latency-critical")
      ->check(CLI::IsMember({"best-effort", "latency-critical"}));
  createTenant->add_option("--devices", devices, "device indices it sees, e.g. 0,1 (default all)");
  createTenant->add_option("--max-connections", maxConnections,
                           "connections it may hold open at once (default: the daemon's)");
  createTenant->add_flag("--json", json, "machine-readable output");

  auto* removeTenant = app.add_subcommand(
      "remove-tenant", "remove a tenant created at run time; its clients are ended and reclaimed");
  removeTenant->add_option("tenant", tenantName, "tenant name")->required();
  removeTenant->add_flag("--json", json, "machine-readable output");

  CLI11_PARSE(app, argc, argv);

  if (status->parsed() || tenants->parsed()) {
    bool tenantsOnly = tenants->parsed();
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto response = admin.statusRequest().send().wait(waitScope);
      auto snapshot = response.getStatus();
      if (tenantsOnly) {
        if (json) {
          printJson(gpuproxy::client::tenantsToJson(snapshot.getTenants()));
        } else {
          std::printf("%s", gpuproxy::client::tenantsToTable(snapshot.getTenants()).c_str());
        }
      } else if (json) {
        printJson(gpuproxy::client::statusToJson(snapshot));
      } else {
        std::printf("%s", gpuproxy::client::statusToTable(snapshot).c_str());
      }
      return 0;
    });
  }

  if (setLimit->parsed()) {
    if (memory.empty() && pinnedMemory.empty() && !weight && tenantClass.empty() &&
        memoryOption->count() == 0 && pinnedOption->count() == 0) {
      return usageError("set-limit needs --memory, --pinned-memory, --weight or --class");
    }
    std::string error;
    const auto bytes = sizeOption(memoryOption, memory, true, error);
    const auto pinnedBytes = sizeOption(pinnedOption, pinnedMemory, true, error);
    if (!error.empty()) return usageError(error);
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto request = admin.setTenantLimitsRequest();
      request.setTenant(tenantName);
      auto update = request.initUpdate();
      if (memory == "none") update.setClearMemoryLimit(true);
      if (bytes) {
        update.setHasMemoryLimit(true);
        update.setMemoryLimit(*bytes);
      }
      if (pinnedMemory == "none") update.setClearPinnedMemoryLimit(true);
      if (pinnedBytes) {
        update.setHasPinnedMemoryLimit(true);
        update.setPinnedMemoryLimit(*pinnedBytes);
      }
      if (weight) {
        update.setHasWeight(true);
        update.setWeight(*weight);
      }
      if (!tenantClass.empty()) {
        update.setHasClass(true);
        update.setClass(tenantClass == "latency-critical"
                            ? gpuproxy::protocol::TenantClass::LATENCY_CRITICAL
                            : gpuproxy::protocol::TenantClass::BEST_EFFORT);
      }
      auto response = request.send().wait(waitScope);
      return report(json, response.getError().cStr(), {{"tenant", tenantName}},
                    "tenant '" + tenantName + "' updated");
    });
  }

  if (createTenant->parsed()) {
    if (weight && *weight == 0) return usageError("--weight must be between 1 and 10000");
    std::string error;
    const auto bytes = sizeOption(createMemory, memory, false, error);
    const auto pinnedBytes = sizeOption(createPinned, pinnedMemory, false, error);
    if (!error.empty()) return usageError(error);
    std::vector<std::uint32_t> deviceList;
    if (!devices.empty()) {
      std::size_t start = 0;
      while (start <= devices.size()) {
        const std::size_t comma = std::min(devices.find(',', start), devices.size());
        const std::string item = devices.substr(start, comma - start);
        if (item.empty() || item.size() > 4 ||
            item.find_first_not_of("0123456789") != std::string::npos) {
          return usageError("--devices: '" + devices + "' is not a list of device indices");
        }
        deviceList.push_back(static_cast<std::uint32_t>(std::stoul(item)));
        start = comma + 1;
      }
    }
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto request = admin.createTenantRequest();
      auto spec = request.initSpec();
      spec.setName(tenantName);
      spec.setSocketDirectory(socketDirectory);
      if (bytes) {
        spec.setHasMemoryLimit(true);
        spec.setMemoryLimit(*bytes);
      }
      if (pinnedBytes) {
        spec.setHasPinnedMemoryLimit(true);
        spec.setPinnedMemoryLimit(*pinnedBytes);
      }
      spec.setWeight(weight.value_or(1));
      spec.setClass(tenantClass == "latency-critical"
                        ? gpuproxy::protocol::TenantClass::LATENCY_CRITICAL
                        : gpuproxy::protocol::TenantClass::BEST_EFFORT);
      if (!deviceList.empty()) {
        spec.setHasDevices(true);
        auto list = spec.initDevices(static_cast<unsigned>(deviceList.size()));
        for (unsigned i = 0; i < deviceList.size(); ++i) list.set(i, deviceList[i]);
      }
      spec.setMaxConnections(maxConnections);
      auto response = request.send().wait(waitScope);
      return report(json, response.getError().cStr(),
                    {{"tenant", tenantName},
                     {"id", response.getId()},
                     {"socket", response.getSocket().cStr()}},
                    "tenant '" + tenantName + "' (id " + std::to_string(response.getId()) +
                        ") serves " + response.getSocket().cStr());
    });
  }

  if (removeTenant->parsed()) {
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto request = admin.removeTenantRequest();
      request.setName(tenantName);
      auto response = request.send().wait(waitScope);
      return report(json, response.getError().cStr(),
                    {{"tenant", tenantName}, {"connections_ended", response.getConnectionsEnded()}},
                    "tenant '" + tenantName + "' removed; " +
                        std::to_string(response.getConnectionsEnded()) +
                        " client connection(s) ended");
    });
  }

  if (evict->parsed()) {
    if (pid == 0 || pid > kMaxPid) {
      return usageError("evict: " + std::to_string(pid) + " is not a process id (1 to " +
                        std::to_string(kMaxPid) + ")");
    }
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto request = admin.evictRequest();
      request.setPid(static_cast<std::uint32_t>(pid));
      auto response = request.send().wait(waitScope);
      return report(json, response.getError().cStr(),
                    {{"pid", pid}, {"evicted_connections", response.getEvicted()}},
                    "evicted pid " + std::to_string(pid));
    });
  }
  return 2;
}
