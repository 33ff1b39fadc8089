// reclaim_torture (the long version of tests/integration/torture_test.cpp): `churn`
// clients allocate, copy and launch in loops through the stub while this program kills one of
// them with SIGKILL at a random moment, over and over. After each kill it watches the daemon until
// the device's memory_used is exactly the sum of the survivors' (in one status snapshot) and the
// victim is gone, and records how long that took. At the end it kills everyone and reports what
// the device still holds (bytes leaked: must be 0), the reclaim-time distribution, and whether the
// daemon process ever changed.
//
//   reclaim_torture [--kills N] [--clients N] [--max-age-ms MS] [--seed S] [--hold-bytes SIZE]
//                   [--timeout-ms MS] [--build-dir DIR] [--smoke]
//
// It starts its own gpuproxyd (sim backend) and clients from a build tree: --build-dir, else
// $GPUPROXY_BUILD_DIR, else the tree this program was built in. Status comes over one persistent
// admin connection (Cap'n Proto, as gpuproxyctl speaks it), polled every millisecond, so the
// reclaim time is accurate to about one status round trip, which is reported alongside as the
// measurement floor. Exit code 0 only when nothing leaked, every kill was reclaimed within
// --timeout-ms, no survivor failed and the daemon was never replaced.
//
// The reclaim time is split three ways, so that the kernel's part and the daemon's are measured
// apart in the same run: `exit` is kill() to the victim's pidfd (opened here, before the kill)
// turning readable, i.e. the kernel has torn the process down (its mappings, then its files,
// including the daemon socket) and the daemon can first know; `detect` is from there until the
// victim is gone from the client list; `free` is from there until the device's memory_used is
// back to the survivors' sum.
#include "benchmarks/harness_support.hpp"
#include "tests/support/process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpuproxy::bench;
namespace testing = gpuproxy::testing;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr const char* kProgram = "reclaim_torture";
constexpr double kTargetMs = 100;  // the target for one reclaim

struct Options {
  long kills = 1000;
  long clients = 4;
  long maxAgeMs = 2000;
  long seed = 4;
  std::uint64_t holdBytes = std::uint64_t{128} << 20;
  long timeoutMs = 10000;
  std::string buildDir;
};

void usage() {
  std::printf(
      "usage: reclaim_torture [--kills N] [--clients N] [--max-age-ms MS] [--seed S]\n"
      "                       [--hold-bytes SIZE] [--timeout-ms MS] [--build-dir DIR] [--smoke]\n"
      "  --kills       SIGKILLs to deliver (default 1000)\n"
      "  --clients     churn clients running at any time (default 4)\n"
      "  --max-age-ms  each victim dies at a random age up to this (default 2000)\n"
      "  --seed        seeds the kill schedule and the clients (default 4)\n"
      "  --hold-bytes  most memory each client keeps between operations (default 128MiB)\n"
      "  --timeout-ms  a kill not reclaimed by then counts as a leak (default 10000)\n"
      "  --build-dir   build tree holding bin/gpuproxyd, the stub and tests/programs/churn\n"
      "                (default: $GPUPROXY_BUILD_DIR, else the tree this program is in)\n"
      "  --smoke       5 kills, 2 clients: checks that it runs (numbers meaningless)\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--kills")) {
      options.kills = args.integer(1);
    } else if (args.is("--clients")) {
      options.clients = args.integer(1);
    } else if (args.is("--max-age-ms")) {
      options.maxAgeMs = args.integer(0);
    } else if (args.is("--seed")) {
      options.seed = args.integer(0);
    } else if (args.is("--hold-bytes")) {
      options.holdBytes = args.bytes();
    } else if (args.is("--timeout-ms")) {
      options.timeoutMs = args.integer(1);
    } else if (args.is("--build-dir")) {
      options.buildDir = std::string(args.value());
    } else if (args.is("--smoke")) {
      options.kills = 5;
      options.clients = 2;
      options.maxAgeMs = 1000;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

class ChurnClient {
public:
  ChurnClient(const testing::Daemon& daemon, const testing::TempDir& directory, std::uint64_t seed,
              std::uint64_t holdBytes)
      : seed_(seed), phaseFile_(directory.file("phase-" + std::to_string(seed))) {
    process_ = daemon.startClient("churn", {"--seed", std::to_string(seed), "--hold-bytes",
                                            std::to_string(holdBytes), "--phase-file", phaseFile_});
  }
  ~ChurnClient() { std::filesystem::remove(phaseFile_); }
  ChurnClient(const ChurnClient&) = delete;
  ChurnClient& operator=(const ChurnClient&) = delete;

  testing::Child& process() { return *process_; }
  std::uint64_t seed() const { return seed_; }
  steady_clock::time_point startedAt() const { return startedAt_; }
  // What it was doing (see churn.cpp); read after it died, so final.
  std::string phase() const {
    std::ifstream in(phaseFile_);
    std::string text;
    std::getline(in, text, '\0');
    return text.empty() ? "exec" : text;
  }

private:
  std::uint64_t seed_;
  std::string phaseFile_;
  steady_clock::time_point startedAt_ = steady_clock::now();
  std::unique_ptr<testing::Child> process_;
};

struct Kill {
  double exitMs = 0;    // until the victim's pidfd turned readable: the kernel's part
  double detachMs = 0;  // until the victim left the client list: the daemon noticed the death
  double reclaimMs = 0;
  bool reclaimed = false;
  std::uint64_t victimHeld = 0;
  std::string phase;
};

// Phases grouped the way the issue talks about them.
std::string phaseGroup(const std::string& phase) {
  if (phase.rfind("copy-", 0) == 0) return "mid-copy (" + phase + ")";
  if (phase.rfind("launch-", 0) == 0 || phase == "sync" || phase == "ctx-sync") {
    return "launch / sync (" + phase + ")";
  }
  return phase;
}

struct Failure {
  std::string what;
};

class Torture {
public:
  explicit Torture(const Options& options)
      : options_(options), random_(static_cast<std::uint64_t>(options.seed)) {}
  int run();

private:
  std::unique_ptr<ChurnClient> startClient() {
    return std::make_unique<ChurnClient>(*daemon_, phases_, nextSeed_++, options_.holdBytes);
  }
  DaemonSnapshot checkedSnapshot();
  void killOne(long index);
  void report(double totalSeconds, std::optional<std::uint64_t> leaked,
              const std::string& deviceName);

  Options options_;
  std::mt19937_64 random_;
  std::unique_ptr<testing::Daemon> daemon_;
  std::unique_ptr<AdminConnection> admin_;
  testing::TempDir phases_;
  std::vector<std::unique_ptr<ChurnClient>> clients_;
  std::uint64_t nextSeed_ = 0;
  pid_t daemonPid_ = 0;
  std::vector<Kill> kills_;
  long daemonReplaced_ = 0;
};

DaemonSnapshot Torture::checkedSnapshot() {
  DaemonSnapshot snapshot;
  try {
    snapshot = admin_->snapshot();
  } catch (const kj::Exception& error) {
    throw Failure{"the daemon stopped answering: " + std::string(error.getDescription().cStr()) +
                  "\n" + daemon_->log()};
  }
  if (static_cast<pid_t>(snapshot.daemonPid) != daemonPid_) {
    ++daemonReplaced_;
    throw Failure{"the daemon's pid changed from " + std::to_string(daemonPid_) + " to " +
                  std::to_string(snapshot.daemonPid)};
  }
  return snapshot;
}

void Torture::killOne(long index) {
  auto& victim = clients_[random_() % clients_.size()];
  auto age = milliseconds(static_cast<long>(random_() % (options_.maxAgeMs + 1)));
  std::this_thread::sleep_until(victim->startedAt() + age);
  // A client that ended by itself hit a CUDA error or a wrong result (perhaps because reclaiming
  // someone else touched its memory): that fails the run, with its own words.
  for (auto& client : clients_) {
    if (!client->process().running()) {
      throw Failure{"churn --seed " + std::to_string(client->seed()) + " stopped by itself:\n" +
                    client->process().errors()};
    }
  }

  Kill kill;
  const pid_t pid = victim->process().pid();
  DaemonSnapshot before = checkedSnapshot();
  if (auto found = before.clients.find(pid); found != before.clients.end()) {
    kill.victimHeld = found->second;
  }
  // Our own pidfd of the victim (it is our child and not reaped yet, so the pid is still its):
  // readable once the kernel has finished tearing the process down, the earliest moment the
  // daemon's own pidfd or socket can tell it anything.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) throw Failure{"pidfd_open failed: " + std::string(std::strerror(errno))};
  victim->process().signal(SIGKILL);
  const auto killedAt = steady_clock::now();
  const auto deadline = killedAt + milliseconds(options_.timeoutMs);
  std::optional<double> exitedMs;
  // Waits up to `ms` for the victim's exit (noting when it came), or just sleeps once it has.
  auto pause = [&](int ms) {
    if (exitedMs) {
      std::this_thread::sleep_for(milliseconds(ms));
      return;
    }
    pollfd watch{pidfd, POLLIN, 0};
    if (::poll(&watch, 1, ms) > 0) exitedMs = msSince(killedAt);
  };
  pause(0);
  DaemonSnapshot seen;
  bool detached = false;
  do {
    seen = checkedSnapshot();
    pause(0);
    if (!detached && seen.clients.count(pid) == 0) {
      detached = true;
      kill.detachMs = msSince(killedAt);
    }
    if (detached && seen.deviceUsed == seen.clientsUsed) {
      kill.reclaimed = true;
      break;
    }
    pause(1);
  } while (steady_clock::now() < deadline);
  kill.reclaimMs = msSince(killedAt);
  if (!exitedMs) {
    pollfd watch{pidfd, POLLIN, 0};
    ::poll(&watch, 1, -1);
    exitedMs = msSince(killedAt);
  }
  ::close(pidfd);
  // The daemon cannot have seen the death before the kernel reported it; a snapshot that shows
  // it gone first only means the exit was noticed late here (poll granularity).
  kill.exitMs = std::min(*exitedMs, detached ? kill.detachMs : kill.reclaimMs);
  if (!kill.reclaimed) {
    std::fprintf(stderr,
                 "%s: kill %ld (churn --seed %llu): not reclaimed after %ld ms: device holds %llu "
                 "bytes, clients %llu\n",
                 kProgram, index, static_cast<unsigned long long>(victim->seed()),
                 options_.timeoutMs, static_cast<unsigned long long>(seen.deviceUsed),
                 static_cast<unsigned long long>(seen.clientsUsed));
  }
  victim->process().wait();
  kill.phase = victim->phase();
  kills_.push_back(kill);
  victim = startClient();
}

int Torture::run() {
  const std::string buildDir = resolveBuildDir(kProgram, options_.buildDir, {"churn"});
  nextSeed_ = static_cast<std::uint64_t>(options_.seed) * 1'000'000 + 1;
  const auto start = steady_clock::now();
  std::fprintf(stderr, "%s: build tree %s; %ld kills among %ld clients\n", kProgram,
               buildDir.c_str(), options_.kills, options_.clients);
  daemon_ = std::make_unique<testing::Daemon>();
  daemonPid_ = daemon_->pid();
  admin_ = std::make_unique<AdminConnection>(daemon_->adminSocketPath());
  std::string deviceName = checkedSnapshot().deviceName;

  int status = 0;
  std::optional<std::uint64_t> leaked;  // unknown if the run stopped early
  try {
    for (long i = 0; i < options_.clients; ++i) clients_.push_back(startClient());
    for (long i = 0; i < options_.kills; ++i) {
      killOne(i);
      if ((i + 1) % 100 == 0) {
        std::fprintf(stderr, "%s: %ld/%ld kills, %.0f s\n", kProgram, i + 1, options_.kills,
                     msSince(start) / 1000);
      }
    }
    // Everyone goes: what the device still holds then was leaked.
    for (auto& client : clients_) client->process().signal(SIGKILL);
    for (auto& client : clients_) client->process().wait();
    clients_.clear();
    DaemonSnapshot last;
    auto deadline = steady_clock::now() + milliseconds(options_.timeoutMs);
    do {
      last = checkedSnapshot();
      if (last.clients.empty() && last.deviceUsed == 0) break;
      std::this_thread::sleep_for(milliseconds(1));
    } while (steady_clock::now() < deadline);
    leaked = last.deviceUsed;
  } catch (const Failure& failure) {
    std::fprintf(stderr, "%s: FAILED after %zu kills: %s\n", kProgram, kills_.size(),
                 failure.what.c_str());
    status = 1;
  }
  clients_.clear();
  testing::ExitStatus stopped = daemon_->stop();
  if (!stopped.exitedWith(0)) {
    std::fprintf(stderr, "%s: gpuproxyd did not exit cleanly (code %d, signal %d)\n", kProgram,
                 stopped.code, stopped.signal);
    status = 1;
  }
  report(msSince(start) / 1000, leaked, deviceName);
  admin_.reset();
  long unreclaimed =
      std::count_if(kills_.begin(), kills_.end(), [](const Kill& kill) { return !kill.reclaimed; });
  if (!leaked || *leaked != 0 || unreclaimed != 0 || daemonReplaced_ != 0) status = 1;
  return status;
}

std::string formatMs(double ms) {
  return format(ms < 10 ? "%.2f" : "%.1f", ms);
}

void Torture::report(double totalSeconds, std::optional<std::uint64_t> leaked,
                     const std::string& deviceName) {
  std::vector<double> times;
  std::vector<double> detachTimes;
  std::uint64_t held = 0;
  long unreclaimed = 0;
  long withinTarget = 0;
  for (const Kill& kill : kills_) {
    times.push_back(kill.reclaimMs);
    detachTimes.push_back(kill.detachMs);
    held += kill.victimHeld;
    if (!kill.reclaimed) ++unreclaimed;
    if (kill.reclaimed && kill.reclaimMs <= kTargetMs) ++withinTarget;
  }
  LatencySummary summary = summarize(times);
  double maxMs = times.empty() ? 0 : *std::max_element(times.begin(), times.end());
  LatencySummary poll = summarize(admin_ ? admin_->roundTripsMs() : std::vector<double>{});
  double loads[3] = {0, 0, 0};
  if (::getloadavg(loads, 3) != 3) loads[0] = loads[1] = loads[2] = -1;

  std::printf("## reclaim_torture\n\n");
  std::printf(
      "SIGKILL at random moments among %ld `churn` clients (buffers 4 KiB .. 64 MiB, up "
      "to %s kept each), device: %s; victims die at a random age up to %ld ms. Reclaim "
      "time: from kill() returning to the first status snapshot in which the victim is "
      "gone and device memory_used equals the survivors' sum. Load average at the end "
      "(1/5/15 min): %.2f %.2f %.2f.\n\n",
      options_.clients, formatSize(options_.holdBytes).c_str(), deviceName.c_str(),
      options_.maxAgeMs, loads[0], loads[1], loads[2]);

  Table table({"kills", "bytes leaked", "not reclaimed", "reclaim p50 ms", "p90 ms", "p99 ms",
               "max ms", "within 100 ms", "daemon restarts", "run time s"});
  table.add({std::to_string(kills_.size()), leaked ? std::to_string(*leaked) : "-",
             std::to_string(unreclaimed), formatMs(summary.median), formatMs(summary.p90),
             formatMs(summary.p99), formatMs(maxMs),
             kills_.empty() ? "-"
                            : formatPercent(static_cast<double>(withinTarget) /
                                            static_cast<double>(kills_.size())),
             std::to_string(daemonReplaced_), format("%.0f", totalSeconds)});
  table.print();

  std::printf(
      "\nMeasurement floor: one status round trip over the admin connection, p50 %s ms, p99 %s "
      "ms (%zu polls). Victims held %s MiB on average when killed.\n\n",
      formatMs(poll.median).c_str(), formatMs(poll.p99).c_str(), poll.samples,
      format("%.1f", kills_.empty() ? 0.0
                                    : static_cast<double>(held) / (1 << 20) /
                                          static_cast<double>(kills_.size()))
          .c_str());

  // Where the time goes: the kernel's part (exit) and the daemon's (detect + free).
  std::vector<double> exitTimes, detectTimes, freeTimes, daemonTimes;
  long daemonWithinTarget = 0;
  for (const Kill& kill : kills_) {
    const double gone = kill.detachMs > 0 ? kill.detachMs : kill.reclaimMs;
    exitTimes.push_back(kill.exitMs);
    detectTimes.push_back(std::max(0.0, gone - kill.exitMs));
    freeTimes.push_back(std::max(0.0, kill.reclaimMs - gone));
    daemonTimes.push_back(std::max(0.0, kill.reclaimMs - kill.exitMs));
    if (kill.reclaimed && kill.reclaimMs - kill.exitMs <= kTargetMs) ++daemonWithinTarget;
  }
  Table parts({"part", "p50 ms", "p90 ms", "p99 ms", "max ms"});
  auto addPart = [&parts](const std::string& name, const std::vector<double>& values) {
    LatencySummary s = summarize(values);
    double most = values.empty() ? 0 : *std::max_element(values.begin(), values.end());
    parts.add({name, formatMs(s.median), formatMs(s.p90), formatMs(s.p99), formatMs(most)});
  };
  addPart("exit: kill() -> victim's pidfd readable (kernel)", exitTimes);
  addPart("detect: exit -> victim gone from status (daemon)", detectTimes);
  addPart("free: gone -> memory_used back (daemon)", freeTimes);
  addPart("daemon's part: exit -> memory_used back", daemonTimes);
  addPart("detach: kill() -> victim gone", detachTimes);
  addPart("reclaim: kill() -> memory_used back", times);
  parts.print();
  std::printf("\nThe daemon's part alone was within 100 ms for %s of the kills.\n\n",
              kills_.empty() ? "-"
                             : formatPercent(static_cast<double>(daemonWithinTarget) /
                                             static_cast<double>(kills_.size()))
                                   .c_str());

  std::map<std::string, std::vector<const Kill*>> byPhase;
  for (const Kill& kill : kills_) byPhase[phaseGroup(kill.phase)].push_back(&kill);
  Table phases({"victim was in", "kills", "exit p50 ms", "detect p50 ms", "free p50 ms",
                "reclaim p50 ms", "p99 ms", "max ms"});
  for (const auto& [phase, group] : byPhase) {
    std::vector<double> reclaim, exited, detect, freed;
    for (const Kill* kill : group) {
      const double gone = kill->detachMs > 0 ? kill->detachMs : kill->reclaimMs;
      reclaim.push_back(kill->reclaimMs);
      exited.push_back(kill->exitMs);
      detect.push_back(std::max(0.0, gone - kill->exitMs));
      freed.push_back(std::max(0.0, kill->reclaimMs - gone));
    }
    LatencySummary s = summarize(reclaim);
    phases.add({phase, std::to_string(group.size()), formatMs(median(exited)),
                formatMs(median(detect)), formatMs(median(freed)), formatMs(s.median),
                formatMs(s.p99), formatMs(*std::max_element(reclaim.begin(), reclaim.end()))});
  }
  phases.print();
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);
  return Torture(options).run();
}
