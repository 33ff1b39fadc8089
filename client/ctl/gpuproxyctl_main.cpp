// gpuproxyctl: the operator's view of gpuproxyd, over the admin socket.
#include "client/ctl/status_report.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "protocol/byte_size.hpp"
#include "protocol/limits.hpp"

#include <capnp/ez-rpc.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>

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
  setLimit->add_option("--memory", memory, "memory limit per device, e.g. 8GiB, or 'none'");
  setLimit->add_option("--pinned-memory", pinnedMemory,
                       "pinned host memory limit, e.g. 1GiB, or 'none'");
  setLimit->add_option("--weight", weight, "best-effort share (1-10000)");
  setLimit->add_option("--class", tenantClass, "best-effort or latency-critical")
      ->check(CLI::IsMember({"best-effort", "latency-critical"}));
  setLimit->add_flag("--json", json, "machine-readable output");

  auto* evict = app.add_subcommand("evict", "end a client's session and reclaim what it held");
  std::uint32_t pid = 0;
  evict->add_option("pid", pid, "the client's process id")->required();
  evict->add_flag("--json", json, "machine-readable output");

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
    if (memory.empty() && pinnedMemory.empty() && !weight && tenantClass.empty()) {
      std::fprintf(stderr,
                   "gpuproxyctl: set-limit needs --memory, --pinned-memory, --weight or --class\n");
      return 2;
    }
    std::optional<std::uint64_t> pinnedBytes;
    if (!pinnedMemory.empty() && pinnedMemory != "none") {
      pinnedBytes = gpuproxy::protocol::parseByteSize(pinnedMemory);
      if (!pinnedBytes) {
        std::fprintf(stderr, "gpuproxyctl: --pinned-memory: '%s' is not a size (try 1GiB)\n",
                     pinnedMemory.c_str());
        return 2;
      }
    }
    std::optional<std::uint64_t> bytes;
    if (!memory.empty() && memory != "none") {
      bytes = gpuproxy::protocol::parseByteSize(memory);
      if (!bytes) {
        std::fprintf(stderr, "gpuproxyctl: --memory: '%s' is not a size (try 8GiB)\n",
                     memory.c_str());
        return 2;
      }
    }
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

  if (evict->parsed()) {
    return withAdmin(adminSocket, [&](Admin::Client& admin, kj::WaitScope& waitScope) {
      auto request = admin.evictRequest();
      request.setPid(pid);
      auto response = request.send().wait(waitScope);
      return report(json, response.getError().cStr(),
                    {{"pid", pid}, {"evicted_connections", response.getEvicted()}},
                    "evicted pid " + std::to_string(pid));
    });
  }
  return 2;
}
