#pragma once
// gpuproxyd's command line.

#include <cstdint>
#include <string>
#include <variant>

namespace gpuproxy::server {

struct DaemonOptions {
  std::string backend = "auto";  // auto | cuda | sim
  std::string socketPath = "/run/gpuproxy/gpuproxy.sock";
  std::string adminSocketPath = "/run/gpuproxy/admin.sock";
  int simDevices = 1;
  std::uint64_t simMemoryBytes = 16ull << 30;
  std::string logLevel = "info";
  std::string configPath;          // tenants file; empty = only the default tenant
  std::string metricsAddress;      // e.g. 127.0.0.1:9400; empty = no metrics endpoint
  std::string scheduler = "fair";  // fair | fifo
  std::string poller = "auto";     // auto | io_uring | epoll: how the data plane sleeps
};

// The parsed options, or the exit code to leave with (0 after --help, 2 after a usage error; the
// message has been printed).
std::variant<DaemonOptions, int> parseDaemonOptions(int argc, char** argv);

}  // namespace gpuproxy::server
