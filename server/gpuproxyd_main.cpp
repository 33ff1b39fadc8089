// gpuproxyd: the per-node GPU proxy daemon. Everything lives in gpuproxy_server; this is the only
// code that tests do not link.
#include "server/daemon/daemon.hpp"

#include <variant>

int main(int argc, char** argv) {
  auto parsed = gpuproxy::server::parseDaemonOptions(argc, argv);
  if (auto* exitCode = std::get_if<int>(&parsed)) return *exitCode;
  return gpuproxy::server::runDaemon(std::get<gpuproxy::server::DaemonOptions>(parsed));
}
