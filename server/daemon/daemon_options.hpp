#pragma once
// gpuproxyd's command line.

#include "protocol/limits.hpp"
#include "server/backend/sim/sim_backend.hpp"

#include <cstdint>
#include <string>
#include <variant>

namespace gpuproxy::server {

struct DaemonOptions {
  std::string backend = "auto";  // auto | cuda | sim
  // --cuda-driver: the library the cuda backend loads as the driver; empty: the system's
  // libcuda.so.1. Naming one (gpuproxy's own stub, to chain this daemon to another) lifts the
  // guard that keeps a stub the loader finds by accident from standing in for the driver.
  std::string cudaDriver;
  std::string socketPath = protocol::kDefaultClientSocket;
  std::string adminSocketPath = protocol::kDefaultAdminSocket;
  int simDevices = 1;
  std::uint64_t simMemoryBytes = 16ull << 30;
  unsigned simComputeCapability = sim::kSimComputeCapability;  // major * 10 + minor
  // --sim-slow-module-load and --sim-slow-reset DEVICE:MS: that sim device takes MS milliseconds
  // longer to prepare each module, or to reset its context (for testing that they stall no one).
  sim::SlowCall simSlowModuleLoad = {};
  sim::SlowCall simSlowFree = {};
  sim::SlowCall simSlowReset = {};
  std::string logLevel = "info";
  std::string configPath;  // tenants file; empty = only the default tenant
  // --state-dir: where what outlives gpuproxyd is kept (its run-time tenants); empty = nowhere.
  std::string stateDirectory;
  std::string metricsAddress;      // e.g. 127.0.0.1:9400; empty = no metrics endpoint
  std::string scheduler = "fair";  // fair | fifo
  std::string poller = "auto";     // auto | io_uring | epoll: how the data plane sleeps
  // --best-effort-sms: confine best-effort streams to this many SMs of each GPU (green
  // contexts, cuda backend only); latency-critical streams get the rest. At most one is set.
  unsigned bestEffortSms = 0;
  unsigned bestEffortPercent = 0;
  // Connections one tenant may hold open at once, unless its own `max_connections` says; 0 =
  // derived from the descriptor limit, so that one tenant can take at most a quarter of it.
  std::uint32_t maxConnectionsPerTenant = 0;
};

// Parses --best-effort-sms's value: "N" (SMs, N >= 1) or "P%" (a share of each GPU's SMs,
// 1 <= P <= 99). False for anything else.
bool parseBestEffortSms(const std::string& text, unsigned& sms, unsigned& percent);

// The parsed options, or the exit code to leave with (0 after --help, 2 after a usage error; the
// message has been printed).
std::variant<DaemonOptions, int> parseDaemonOptions(int argc, char** argv);

}  // namespace gpuproxy::server
