// isolation_load: many tenants share one daemon while one of them attacks it. Two runs on fresh
// daemons (sim backend, two devices: the well-behaved tenants' clients on device 0, the attackers'
// never-ending kernels alone on device 1), the same in everything but the attackers:
//
// - `steady_client`s spread over the well-behaved tenants hold memory and time a launch +
//   synchronise round trip at a fixed pace (tests/programs/steady_client.cpp): their latency
//   percentiles and round trips per second are what the attack must not move;
// - `churn` clients in those tenants allocate, copy and launch, and are SIGKILLed at random and
//   started again, so that reclamation runs all the time;
// - in the attacked run, two more tenants run every attack of tests/programs/hostile_client.cpp
//   at once (tiny allocations, queue floods behind a kernel that never ends, stream, event,
//   module and context floods, an oversized module image, a corrupted ring), each killed after a
//   random lifetime and started again, plus a flood of idle connections to their socket.
//
// Reported per run: the steady clients' round trip p50/p99/p99.9 and throughput, their errors,
// the daemon's largest resident set and descriptor count, the bytes still charged once every
// client has gone (must be 0) and whether the daemon process was ever replaced (must not be).
// Exit code 0 only when nothing leaked, the daemon survived both runs and no steady client failed.
//
//   isolation_load [--seconds S] [--clients N] [--tenants T] [--interval-ms MS] [--seed S]
//                  [--no-baseline | --no-attackers] [--build-dir DIR] [--smoke]
#include "benchmarks/harness_support.hpp"
#include "tests/support/process.hpp"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpuproxy::bench;
namespace testing = gpuproxy::testing;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr const char* kProgram = "isolation_load";

struct Options {
  long seconds = 120;
  long clients = 256;
  long tenants = 8;
  long intervalMs = 20;
  long seed = 7;
  long idleConnections = 200;
  bool baseline = true;
  bool attackers = true;
  std::string buildDir;
};

void usage() {
  std::printf(
      "usage: isolation_load [--seconds S] [--clients N] [--tenants T] [--interval-ms MS]\n"
      "                      [--seed S] [--no-baseline | --no-attackers] [--build-dir DIR]\n"
      "                      [--smoke]\n"
      "  --seconds      length of each run (default 120)\n"
      "  --clients      steady and churn clients of the well-behaved tenants (default 256)\n"
      "  --tenants      well-behaved tenants (default 8); two attacking tenants come on top\n"
      "  --interval-ms  how often each steady client does its round trip (default 20)\n"
      "  --seed         seeds the kill schedule and the churn clients (default 7)\n"
      "  --no-baseline  only the run with attackers\n"
      "  --no-attackers only the baseline run\n"
      "  --build-dir    build tree holding bin/gpuproxyd, the stub and tests/programs\n"
      "  --smoke        12 s runs, 12 clients over 3 tenants: checks that it runs\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--seconds")) {
      options.seconds = args.integer(1);
    } else if (args.is("--clients")) {
      options.clients = args.integer(2);
    } else if (args.is("--tenants")) {
      options.tenants = args.integer(1);
    } else if (args.is("--interval-ms")) {
      options.intervalMs = args.integer(1);
    } else if (args.is("--seed")) {
      options.seed = args.integer(0);
    } else if (args.is("--no-baseline")) {
      options.baseline = false;
    } else if (args.is("--no-attackers")) {
      options.attackers = false;
    } else if (args.is("--build-dir")) {
      options.buildDir = std::string(args.value());
    } else if (args.is("--smoke")) {
      options.seconds = 12;
      options.clients = 12;
      options.tenants = 3;
      options.idleConnections = 20;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

// The fixed buckets of steady_client's histogram, summed over clients.
class LatencyHistogram {
public:
  void add(double upperUs, unsigned long long count) {
    counts_[upperUs] += count;
    total_ += count;
  }
  unsigned long long total() const { return total_; }
  // The bucket bound at or below which `fraction` of the round trips fell.
  double percentileUs(double fraction) const {
    if (total_ == 0) return 0;
    const auto wanted = static_cast<unsigned long long>(std::ceil(fraction * total_));
    unsigned long long seen = 0;
    for (const auto& [upper, count] : counts_) {
      seen += count;
      if (seen >= wanted) return upper;
    }
    return counts_.rbegin()->first;
  }

private:
  std::map<double, unsigned long long> counts_;
  unsigned long long total_ = 0;
};

// A connection that never attaches: it costs the daemon descriptors and nothing else.
int idleConnection(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket.c_str(), sizeof(address.sun_path) - 1);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    return fd;
  }
  if (fd >= 0) ::close(fd);
  return -1;
}

struct RunResult {
  std::string name;
  long steadyClients = 0;
  LatencyHistogram latency;
  double roundTripsPerSecond = 0;
  unsigned long long steadyErrors = 0;
  long steadyFailed = 0;  // steady clients that did not exit 0 with a report
  long churnKills = 0;
  long churnFailures = 0;
  long attackerStarts = 0;
  long idleConnections = 0;
  testing::ProcessUsage peak;
  testing::ProcessUsage atStart;
  std::optional<std::uint64_t> leakedBytes;
  long daemonReplaced = 0;
  bool daemonExitedCleanly = false;
  std::string problems;
};

// One attack and how to start it again after it is killed.
struct Attack {
  std::string tenantSocket;
  std::vector<std::string> arguments;
  std::unique_ptr<testing::Child> process;
  steady_clock::time_point killAt;
};

class LoadRun {
public:
  LoadRun(const Options& options, bool attacked)
      : options_(options), attacked_(attacked), random_(static_cast<std::uint64_t>(options.seed)) {}

  RunResult run();

private:
  void writeConfig();
  void startClients();
  void startAttacks();
  void killAndRestartSome();
  void sample();
  void finish();
  std::string tenantSocket(long tenant) const {
    return directory_.file("t" + std::to_string(tenant) + "/gpuproxy.sock");
  }

  const Options& options_;
  const bool attacked_;
  std::mt19937_64 random_;
  testing::TempDir directory_;
  std::string mallory_ = directory_.file("mallory/gpuproxy.sock");
  std::string mallet_ = directory_.file("mallet/gpuproxy.sock");
  std::unique_ptr<testing::Daemon> daemon_;
  std::unique_ptr<AdminConnection> admin_;
  pid_t daemonPid_ = 0;
  std::vector<std::unique_ptr<testing::Child>> steady_;
  struct Churn {
    std::string socket;
    std::unique_ptr<testing::Child> process;
    steady_clock::time_point killAt;
  };
  std::vector<Churn> churn_;
  std::vector<Attack> attacks_;
  std::vector<int> idle_;
  std::uint64_t nextSeed_ = 0;
  RunResult result_;
};

void LoadRun::writeConfig() {
  std::ofstream config(directory_.file("tenants.yaml"));
  config << "tenants:\n";
  for (long t = 0; t < options_.tenants; ++t) {
    config << "  - name: t" << t << "\n    socket: " << tenantSocket(t)
           << "\n    memory_limit: 2GiB\n";
  }
  // Both attackers have the same limits as any tenant. `mallet` alone uses device 1, where its
  // never-ending kernels hold the engine: kernels cannot be preempted, so a device shared with
  // such a kernel stalls by design (the scheduler decides only what starts next); what must not
  // stall is the daemon, and so every other device.
  config << "  - name: mallory\n    socket: " << mallory_ << "\n    memory_limit: 2GiB\n";
  config << "  - name: mallet\n    socket: " << mallet_
         << "\n    memory_limit: 2GiB\n    devices: [1]\n";
}

void LoadRun::startClients() {
  // One client in eight churns (and is killed at random); the rest are steady.
  const long churners = std::max(1L, options_.clients / 8);
  for (long i = 0; i < options_.clients; ++i) {
    const std::string socket = tenantSocket(i % options_.tenants);
    if (i < churners) {
      Churn churn{socket, nullptr, {}};
      churn_.push_back(std::move(churn));
      continue;
    }
    steady_.push_back(
        daemon_->startClientOn(socket, "steady_client",
                               {"--interval-us", std::to_string(options_.intervalMs * 1000),
                                "--hold-bytes", std::to_string(4 << 20), "--device", "0"}));
  }
  result_.steadyClients = static_cast<long>(steady_.size());
  for (auto& churn : churn_) {
    churn.process =
        daemon_->startClientOn(churn.socket, "churn",
                               {"--seed", std::to_string(nextSeed_++), "--hold-bytes",
                                std::to_string(16 << 20), "--max-bytes", std::to_string(4 << 20)});
    churn.killAt = steady_clock::now() + milliseconds(500 + random_() % 4000);
  }
}

void LoadRun::startAttacks() {
  const std::vector<std::pair<std::string, std::vector<std::string>>> attacks = {
      {mallory_, {"tiny-allocs", "262144"}},
      {mallet_, {"queue-flood", "memset", "3600"}},
      {mallet_, {"queue-flood", "event", "3600"}},
      {mallory_, {"create-flood", "stream", "100000"}},
      {mallory_, {"create-flood", "event", "100000"}},
      {mallory_, {"create-flood", "module", "10000"}},
      {mallory_, {"create-flood", "context", "10000"}},
      {mallory_, {"big-module", "250"}},
      {mallory_, {"corrupt-ring"}},
  };
  for (const auto& [socket, arguments] : attacks) {
    attacks_.push_back(Attack{socket, arguments, nullptr, {}});
  }
  for (long i = 0; i < options_.idleConnections; ++i) {
    const int fd = idleConnection(i % 2 == 0 ? mallory_ : mallet_);
    if (fd >= 0) idle_.push_back(fd);
  }
  result_.idleConnections = static_cast<long>(idle_.size());
}

void LoadRun::killAndRestartSome() {
  const auto now = steady_clock::now();
  for (auto& churn : churn_) {
    if (churn.process && !churn.process->running()) {
      ++result_.churnFailures;
      std::fprintf(stderr, "%s: a churn client stopped by itself: %s\n", kProgram,
                   churn.process->errors().c_str());
      churn.killAt = now;
    }
    if (now < churn.killAt) continue;
    if (churn.process && churn.process->running()) {
      churn.process->signal(SIGKILL);
      ++result_.churnKills;
    }
    churn.process =
        daemon_->startClientOn(churn.socket, "churn",
                               {"--seed", std::to_string(nextSeed_++), "--hold-bytes",
                                std::to_string(16 << 20), "--max-bytes", std::to_string(4 << 20)});
    churn.killAt = now + milliseconds(500 + random_() % 4000);
  }
  for (auto& attack : attacks_) {
    if (attack.process && attack.process->running() && now < attack.killAt) continue;
    if (attack.process && attack.process->running()) attack.process->signal(SIGKILL);
    attack.process =
        daemon_->startClientOn(attack.tenantSocket, "hostile_client", attack.arguments);
    attack.killAt = now + milliseconds(2000 + random_() % 8000);
    ++result_.attackerStarts;
  }
}

void LoadRun::sample() {
  testing::ProcessUsage usage = testing::usageOf(daemonPid_);
  result_.peak.residentBytes = std::max(result_.peak.residentBytes, usage.residentBytes);
  result_.peak.descriptors = std::max(result_.peak.descriptors, usage.descriptors);
}

void LoadRun::finish() {
  // The steady clients report on SIGTERM; everyone else is killed.
  for (auto& client : steady_) client->signal(SIGTERM);
  const double seconds = static_cast<double>(options_.seconds);
  unsigned long long roundTrips = 0;
  for (auto& client : steady_) {
    testing::ExitStatus status = client->wait(std::chrono::seconds(60));
    std::istringstream lines(client->output());
    bool reported = false;
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string key;
      words >> key;
      if (key == "round_trips") {
        unsigned long long count = 0;
        words >> count;
        roundTrips += count;
        reported = true;
      } else if (key == "errors") {
        unsigned long long count = 0;
        words >> count;
        result_.steadyErrors += count;
      } else if (key == "latency_us") {
        double upper = 0;
        unsigned long long count = 0;
        words >> upper >> count;
        result_.latency.add(upper, count);
      }
    }
    if (!status.exitedWith(0) || !reported) {
      ++result_.steadyFailed;
      result_.problems += "a steady client failed: " + client->errors() + "\n";
    }
  }
  result_.roundTripsPerSecond = static_cast<double>(roundTrips) / seconds;
  for (auto& churn : churn_) {
    if (churn.process) churn.process->signal(SIGKILL);
  }
  for (auto& attack : attacks_) {
    if (attack.process) attack.process->signal(SIGKILL);
  }
  for (int fd : idle_) ::close(fd);
  idle_.clear();
  for (auto& churn : churn_) {
    if (churn.process) churn.process->wait();
  }
  for (auto& attack : attacks_) {
    if (attack.process) attack.process->wait();
  }
  steady_.clear();
  churn_.clear();
  attacks_.clear();
  // Everyone has gone: whatever is still charged was leaked.
  const auto deadline = steady_clock::now() + std::chrono::seconds(60);
  DaemonSnapshot last;
  do {
    last = admin_->snapshot();
    if (last.clients.empty() && last.devicesUsed == 0) break;
    std::this_thread::sleep_for(milliseconds(20));
  } while (steady_clock::now() < deadline);
  if (static_cast<pid_t>(last.daemonPid) != daemonPid_) ++result_.daemonReplaced;
  result_.leakedBytes = last.devicesUsed;
  sample();
}

RunResult LoadRun::run() {
  result_.name = attacked_ ? "with attackers" : "baseline (no attackers)";
  writeConfig();
  testing::Daemon::Options daemonOptions;
  daemonOptions.simDevices = 2;
  daemonOptions.extraArguments = {"--config", directory_.file("tenants.yaml")};
  daemon_ = std::make_unique<testing::Daemon>(daemonOptions);
  daemonPid_ = daemon_->pid();
  admin_ = std::make_unique<AdminConnection>(daemon_->adminSocketPath());
  result_.atStart = testing::usageOf(daemonPid_);
  try {
    startClients();
    if (attacked_) startAttacks();
    const auto end = steady_clock::now() + std::chrono::seconds(options_.seconds);
    auto nextReport = steady_clock::now() + std::chrono::seconds(10);
    while (steady_clock::now() < end) {
      killAndRestartSome();
      sample();
      const DaemonSnapshot snapshot = admin_->snapshot();
      if (static_cast<pid_t>(snapshot.daemonPid) != daemonPid_ || ::kill(daemonPid_, 0) != 0) {
        ++result_.daemonReplaced;
        throw std::runtime_error("the daemon is gone");
      }
      if (steady_clock::now() >= nextReport) {
        std::fprintf(stderr, "%s: %s: %zu clients attached, daemon RSS %s, %llu descriptors\n",
                     kProgram, result_.name.c_str(), snapshot.clients.size(),
                     formatSize(testing::usageOf(daemonPid_).residentBytes).c_str(),
                     static_cast<unsigned long long>(testing::usageOf(daemonPid_).descriptors));
        nextReport += std::chrono::seconds(10);
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    finish();
  } catch (const std::exception& error) {
    result_.problems += std::string("run stopped: ") + error.what() + "\n" + daemon_->log();
  } catch (const kj::Exception& error) {
    result_.problems += std::string("the daemon stopped answering: ") +
                        error.getDescription().cStr() + "\n" + daemon_->log();
  }
  steady_.clear();
  churn_.clear();
  attacks_.clear();
  for (int fd : idle_) ::close(fd);
  admin_.reset();
  result_.daemonExitedCleanly = daemon_->stop().exitedWith(0);
  return std::move(result_);
}

std::string formatUs(double us) {
  return format(us < 100 ? "%.1f us" : "%.0f us", us);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const std::string buildDir =
      resolveBuildDir(kProgram, options.buildDir, {"steady_client", "churn", "hostile_client"});
  std::fprintf(stderr, "%s: build tree %s; %ld s per run, %ld clients over %ld tenants\n", kProgram,
               buildDir.c_str(), options.seconds, options.clients, options.tenants);
  std::vector<RunResult> results;
  if (options.baseline) results.push_back(LoadRun(options, false).run());
  if (options.attackers) results.push_back(LoadRun(options, true).run());

  std::printf(
      "\n### isolation_load: %ld clients over %ld tenants, %ld s per run, a round trip "
      "every %ld ms per steady client\n\n",
      options.clients, options.tenants, options.seconds, options.intervalMs);
  Table table({"run", "steady clients", "round trips/s", "p50", "p99", "p99.9", "steady errors",
               "churn kills", "attacker starts", "daemon RSS start / peak", "fds peak", "leaked",
               "daemon replaced"});
  int status = 0;
  for (const RunResult& result : results) {
    table.add(
        {result.name, std::to_string(result.steadyClients),
         format("%.0f", result.roundTripsPerSecond), formatUs(result.latency.percentileUs(0.50)),
         formatUs(result.latency.percentileUs(0.99)), formatUs(result.latency.percentileUs(0.999)),
         std::to_string(result.steadyErrors + static_cast<unsigned long long>(result.steadyFailed)),
         std::to_string(result.churnKills), std::to_string(result.attackerStarts),
         formatSize(result.atStart.residentBytes) + " / " + formatSize(result.peak.residentBytes),
         std::to_string(result.peak.descriptors),
         result.leakedBytes ? formatSize(*result.leakedBytes) : "unknown",
         std::to_string(result.daemonReplaced)});
    if (!result.problems.empty()) {
      std::fprintf(stderr, "%s: %s:\n%s", kProgram, result.name.c_str(), result.problems.c_str());
    }
    if (!result.leakedBytes || *result.leakedBytes != 0 || result.daemonReplaced != 0 ||
        !result.daemonExitedCleanly || result.steadyFailed != 0 || result.steadyErrors != 0 ||
        result.churnFailures != 0) {
      status = 1;
    }
  }
  table.print();
  return status;
}
