#pragma once
// What the benchmarks that start their own daemon and clients share (reclaim_torture,
// isolation_load): finding the build tree whose binaries they run, and watching the daemon over
// one admin connection.

#include "benchmarks/bench_support.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <capnp/ez-rpc.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace gpuproxy::bench {

// The build tree holding bin/gpuproxyd and tests/programs/<each of `programs`>: `chosen` (the
// --build-dir option), else $GPUPROXY_BUILD_DIR, else the tree this program was built in. It is
// exported as $GPUPROXY_BUILD_DIR, where the helpers in tests/support look for every binary.
// Exits with a usage error naming `benchmark` when there is none.
inline std::string resolveBuildDir(const char* benchmark, std::string chosen,
                                   const std::vector<std::string>& programs) {
  auto isBuildTree = [&](const std::filesystem::path& dir) {
    std::error_code ignored;
    if (!std::filesystem::exists(dir / "bin" / "gpuproxyd", ignored)) return false;
    for (const std::string& program : programs) {
      if (!std::filesystem::exists(dir / "tests" / "programs" / program, ignored)) return false;
    }
    return true;
  };
  if (chosen.empty()) {
    if (const char* env = std::getenv("GPUPROXY_BUILD_DIR")) chosen = env;
  }
  if (chosen.empty()) {
    std::error_code error;
    auto dir = std::filesystem::read_symlink("/proc/self/exe", error).parent_path();
    for (; !error && dir.has_relative_path(); dir = dir.parent_path()) {
      if (isBuildTree(dir)) {
        chosen = dir.string();
        break;
      }
    }
  }
  if (chosen.empty() || !isBuildTree(chosen)) {
    std::string needed = "bin/gpuproxyd";
    for (const std::string& program : programs) needed += ", tests/programs/" + program;
    failUsage(benchmark,
              "no build tree with " + needed + " at '" + chosen + "' (pass --build-dir)");
  }
  chosen = std::filesystem::absolute(chosen).string();
  ::setenv("GPUPROXY_BUILD_DIR", chosen.c_str(), 1);
  return chosen;
}

// What the daemon reports, reduced to what the harnesses check.
struct DaemonSnapshot {
  std::uint32_t daemonPid = 0;
  std::string deviceName;         // device 0's
  std::uint64_t deviceUsed = 0;   // device 0's memory_used
  std::uint64_t devicesUsed = 0;  // every device's memory_used, summed
  std::uint64_t clientsUsed = 0;
  std::map<pid_t, std::uint64_t> clients;  // pid -> memory_used
};

inline double msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// One admin connection for the whole run: a fresh gpuproxyctl per poll would cost a fork, an exec
// and a connect each time, and make the measurement mostly that. Throws kj::Exception when the
// daemon stops answering.
class AdminConnection {
public:
  explicit AdminConnection(const std::string& socket)
      : rpc_("unix:" + socket), admin_(rpc_.getMain<protocol::Admin>()) {}

  DaemonSnapshot snapshot() {
    const auto start = std::chrono::steady_clock::now();
    auto response = admin_.statusRequest().send().wait(rpc_.getWaitScope());
    roundTripsMs_.push_back(msSince(start));
    auto status = response.getStatus();
    DaemonSnapshot out;
    out.daemonPid = status.getPid();
    auto devices = status.getDevices();
    for (unsigned i = 0; i < devices.size(); ++i) {
      if (i == 0) {
        out.deviceName = devices[i].getName();
        out.deviceUsed = devices[i].getMemoryUsed();
      }
      out.devicesUsed += devices[i].getMemoryUsed();
    }
    for (auto client : status.getClients()) {
      out.clientsUsed += client.getMemoryUsed();
      out.clients[static_cast<pid_t>(client.getPid())] = client.getMemoryUsed();
    }
    return out;
  }
  // How long each snapshot took: the floor of any time measured by polling them.
  const std::vector<double>& roundTripsMs() const { return roundTripsMs_; }

private:
  capnp::EzRpcClient rpc_;
  protocol::Admin::Client admin_;
  std::vector<double> roundTripsMs_;
};

}  // namespace gpuproxy::bench
