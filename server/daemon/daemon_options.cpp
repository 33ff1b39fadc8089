#include "server/daemon/daemon_options.hpp"

#include "protocol/byte_size.hpp"

#include <CLI/CLI.hpp>

namespace gpuproxy::server {

std::variant<DaemonOptions, int> parseDaemonOptions(int argc, char** argv) {
  DaemonOptions options;
  std::string simMemory = "16GiB";
  CLI::App app{
      "gpuproxyd: owns the GPUs of this node and serves CUDA clients through the gpuproxy stub"};
  app.add_option("--backend", options.backend,
                 "auto: the real GPU when a driver and a device are present, else the simulator")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
  app.add_option("--socket", options.socketPath, "Unix socket clients connect to")
      ->capture_default_str();
  app.add_option("--admin-socket", options.adminSocketPath, "Unix socket for gpuproxyctl")
      ->capture_default_str();
  app.add_option("--sim-devices", options.simDevices, "Simulated devices (sim backend)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--sim-memory", simMemory, "Memory of each simulated device, e.g. 16GiB")
      ->capture_default_str();
  app.add_option("--config", options.configPath,
                 "Tenants file (YAML); SIGHUP reloads it. Without it, every client of --socket is "
                 "the unlimited tenant 'default'")
      ->check(CLI::ExistingFile);
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
  return options;
}

}  // namespace gpuproxy::server
