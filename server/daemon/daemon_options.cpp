#include "server/daemon/daemon_options.hpp"

#include "protocol/byte_size.hpp"

#include <CLI/CLI.hpp>

#include <map>

namespace gpuproxy::server {

bool parseBestEffortSms(const std::string& text, unsigned& sms, unsigned& percent) {
  sms = 0;
  percent = 0;
  std::string digits = text;
  const bool isPercent = !digits.empty() && digits.back() == '%';
  if (isPercent) digits.pop_back();
  if (digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const unsigned value = static_cast<unsigned>(std::stoul(digits));
  if (isPercent) {
    if (value < 1 || value > 99) return false;
    percent = value;
  } else {
    if (value < 1) return false;
    sms = value;
  }
  return true;
}

namespace {
// DEVICE:MS for a --sim-slow-* option; an empty value leaves `out` alone. Says why on stderr
// when the value is not one.
bool parseSlowCall(const char* option, const std::string& value, int devices, sim::SlowCall& out) {
  if (value.empty()) return true;
  unsigned device = 0;
  unsigned milliseconds = 0;
  char end = 0;
  if (std::sscanf(value.c_str(), "%u:%u%c", &device, &milliseconds, &end) != 2 ||
      device >= static_cast<unsigned>(devices) || milliseconds > 600'000) {
    std::fprintf(stderr,
                 "gpuproxyd: %s: '%s' is not DEVICE:MS with a device below --sim-devices and at "
                 "most 600000 ms\n",
                 option, value.c_str());
    return false;
  }
  out = sim::SlowCall{static_cast<int>(device), std::chrono::milliseconds(milliseconds)};
  return true;
}
}  // namespace

std::variant<DaemonOptions, int> parseDaemonOptions(int argc, char** argv) {
  DaemonOptions options;
  std::string simMemory = "16GiB";
  std::string slowModuleLoad;
  std::string slowFree;
  std::string slowReset;
  std::string bestEffortSms;
  CLI::App app{
      "gpuproxyd: owns the GPUs of this node and serves CUDA clients through the gpuproxy stub"};
  app.add_option("--backend", options.backend,
                 "auto: the real GPU when a driver and a device are present, else the simulator")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
  app.add_option("--cuda-driver", options.cudaDriver,
                 "Library the cuda backend loads as the CUDA driver (default: the system's "
                 "libcuda.so.1). Naming gpuproxy's own stub chains this daemon to the one the "
                 "stub's GPUPROXY_SOCKET names");
  app.add_option("--socket", options.socketPath, "Unix socket clients connect to")
      ->capture_default_str();
  app.add_option("--admin-socket", options.adminSocketPath, "Unix socket for gpuproxyctl")
      ->capture_default_str();
  app.add_option("--sim-devices", options.simDevices, "Simulated devices (sim backend)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--sim-memory", simMemory, "Memory of each simulated device, e.g. 16GiB")
      ->capture_default_str();
  std::map<std::string, unsigned> computeCapabilities;
  for (unsigned each : sim::kSimComputeCapabilities) {
    computeCapabilities.emplace(backend::computeCapabilityName(each), each);
  }
  app.add_option("--sim-compute-capability", options.simComputeCapability,
                 "Compute capability the simulated devices report, and so the PTX of a fatbin they "
                 "run (9.0 is an H100's). 12.0 makes libraries that ship PTX only for the newest "
                 "GPUs (cuSPARSE, cuBLAS) pick the kernels built for it; the rest of the device is "
                 "still an H100's")
      ->transform(CLI::CheckedTransformer(computeCapabilities))
      ->default_str(backend::computeCapabilityName(options.simComputeCapability));
  app.add_option("--sim-slow-module-load", slowModuleLoad,
                 "DEVICE:MS: sim device DEVICE takes MS milliseconds more to load each module, "
                 "as a large PTX JIT does on a GPU (for testing)")
      ->group("Testing");
  app.add_option("--sim-slow-free", slowFree,
                 "DEVICE:MS: sim device DEVICE takes MS milliseconds more to free each allocation "
                 "and to unload each module, as cuMemFree and cuModuleUnload do on a GPU when "
                 "they wait for the device (for testing)")
      ->group("Testing");
  app.add_option("--sim-slow-reset", slowReset,
                 "DEVICE:MS: sim device DEVICE takes MS milliseconds more to reset its context "
                 "after a sticky fault, as recreating a context does on a GPU (for testing)")
      ->group("Testing");
  app.add_option("--config", options.configPath,
                 "Tenants file (YAML); SIGHUP reloads it. Without it, every client of --socket is "
                 "the unlimited tenant 'default'")
      ->check(CLI::ExistingFile);
  app.add_option("--state-dir", options.stateDirectory,
                 "Keep the run-time tenants (gpuproxyctl create-tenant, the Kubernetes device "
                 "plugin's allocations) in this directory, so that a restarted gpuproxyd serves "
                 "them again at the same sockets, with their limits and pod bindings, and leave "
                 "their socket directories in place when it stops. Without it they end with the "
                 "daemon");
  app.add_option("--metrics-address", options.metricsAddress,
                 "Serve Prometheus metrics over HTTP at HOST:PORT, e.g. 127.0.0.1:9400");
  app.add_option("--scheduler", options.scheduler,
                 "How kernels of different clients share a GPU. fair: latency-critical tenants "
                 "first, best-effort tenants by weight (measured GPU time); fifo: arrival order, "
                 "as time-slicing or MPS would (the baseline)")
      ->check(CLI::IsMember({"fair", "fifo"}))
      ->capture_default_str();
  app.add_option("--poller", options.poller,
                 "How the data plane sleeps on client doorbells and pidfds: io_uring, epoll, or "
                 "auto (io_uring unless the kernel or a seccomp profile refuses it)")
      ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
      ->capture_default_str();
  app.add_option("--best-effort-sms", bestEffortSms,
                 "Confine best-effort tenants' kernels to N SMs of each GPU, or to P% of them "
                 "(e.g. 112 or 85%), with green contexts; latency-critical tenants' kernels get "
                 "the other SMs. The driver rounds N up to its partition granularity (8 SMs on "
                 "Hopper). cuda backend only, CUDA 12.5+ driver; refused on sim");
  app.add_option("--max-connections-per-tenant", options.maxConnectionsPerTenant,
                 "Connections one tenant may hold open at once (each carries at most one client "
                 "session) unless its own max_connections says otherwise. Default: a quarter of "
                 "the descriptors left for clients, at most 1024")
      ->check(CLI::Range(1, 65536));
  app.add_option("--log-level", options.logLevel, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  auto bytes = protocol::parseByteSize(simMemory);
  if (!bytes || *bytes == 0) {
    std::fprintf(stderr, "gpuproxyd: --sim-memory: '%s' is not a size (try 16GiB)\n",
                 simMemory.c_str());
    return 2;
  }
  options.simMemoryBytes = *bytes;
  if (!parseSlowCall("--sim-slow-module-load", slowModuleLoad, options.simDevices,
                     options.simSlowModuleLoad) ||
      !parseSlowCall("--sim-slow-free", slowFree, options.simDevices, options.simSlowFree) ||
      !parseSlowCall("--sim-slow-reset", slowReset, options.simDevices, options.simSlowReset)) {
    return 2;
  }
  if (!bestEffortSms.empty() &&
      !parseBestEffortSms(bestEffortSms, options.bestEffortSms, options.bestEffortPercent)) {
    std::fprintf(stderr,
                 "gpuproxyd: --best-effort-sms: '%s' is neither a number of SMs (>= 1) nor a "
                 "share of them from 1%% to 99%%\n",
                 bestEffortSms.c_str());
    return 2;
  }
  return options;
}

}  // namespace gpuproxy::server
