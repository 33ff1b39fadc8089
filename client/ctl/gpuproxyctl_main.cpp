// gpuproxyctl: the operator's view of gpuproxyd, over the admin socket.
#include "client/ctl/status_report.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <capnp/ez-rpc.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

namespace {

int printStatus(const std::string& adminSocket, bool json) {
  try {
    capnp::EzRpcClient client("unix:" + adminSocket);
    auto admin = client.getMain<gpuproxy::protocol::Admin>();
    auto response = admin.statusRequest().send().wait(client.getWaitScope());
    auto status = response.getStatus();
    if (json) {
      std::printf("%s\n", gpuproxy::client::statusToJson(status).dump(2).c_str());
    } else {
      std::printf("%s", gpuproxy::client::statusToTable(status).c_str());
    }
    return 0;
  } catch (const kj::Exception& error) {
    std::fprintf(stderr,
                 "gpuproxyctl: cannot reach gpuproxyd at %s: %s\n"
                 "gpuproxyctl: is the daemon running? (--admin-socket PATH chooses the socket)\n",
                 adminSocket.c_str(), error.getDescription().cStr());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpuproxyctl: inspect and manage gpuproxyd"};
  std::string adminSocket = "/run/gpuproxy/admin.sock";
  app.add_option("--admin-socket", adminSocket, "gpuproxyd's admin socket")->capture_default_str();
  app.require_subcommand(1);
  bool json = false;
  auto* status = app.add_subcommand("status", "devices, clients and their use of the GPUs");
  status->add_flag("--json", json, "machine-readable output");
  CLI11_PARSE(app, argc, argv);
  if (status->parsed()) return printStatus(adminSocket, json);
  return 2;
}
