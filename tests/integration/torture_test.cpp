// Issue 4, the short version: `churn` clients allocating, launching and copying in loops are
// killed with SIGKILL at random moments (mid-copy, mid-kernel, mid-attach ...). After every kill
// the daemon's device memory must come back to exactly what the survivors hold, quickly, with the
// same daemon process still serving. benchmarks/reclaim_torture is the long version (1000 kills)
// and reports the reclaim-time distribution against the 100 ms target.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace gpuproxy::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kClients = 3;
constexpr int kKills = 24;
// Each victim dies at a random age up to this: some in start-up (attach, module load: most of a
// second on a loaded machine), most in the allocate/copy/launch loop.
constexpr int kMaxAgeMs = 2000;
// The bound asserted per kill. The target is 100 ms, but what this test observes is the
// reclaim plus one whole `gpuproxyctl status` (fork, exec, connect), which alone takes 10-300 ms
// on a loaded 2-core machine; so the target is measured, not asserted, by
// benchmarks/reclaim_torture over a persistent admin connection, and this bound only has to
// catch a reclaim that hangs: it holds under the sanitizer builds on a loaded machine too, where
// a victim's kernel still on the device (whose buffers are freed once it ends) can take seconds.
constexpr milliseconds kReclaimBound{15000};
// Keeps daemon and client memory modest on CI while buffers still go up to 64 MiB.
constexpr const char* kHoldBytes = "67108864";

struct Snapshot {
  pid_t daemonPid = 0;
  std::uint64_t deviceUsed = 0;
  std::uint64_t clientsUsed = 0;
  std::set<pid_t> pids;
};

Snapshot snapshot(const Daemon& daemon) {
  nlohmann::json status = daemon.status();
  Snapshot out;
  out.daemonPid = status["pid"].get<pid_t>();
  out.deviceUsed = status["devices"][0]["memory_used"].get<std::uint64_t>();
  for (const auto& client : status["clients"]) {
    out.clientsUsed += client["memory_used"].get<std::uint64_t>();
    out.pids.insert(client["pid"].get<pid_t>());
  }
  return out;
}

// What the client was doing when it died, from the file it keeps current (see churn.cpp).
std::string phaseOf(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text, '\0');
  return text.empty() ? "not-started" : text;
}

class ChurnClient {
public:
  ChurnClient(const Daemon& daemon, const TempDir& directory, std::uint64_t seed)
      : seed_(seed), phaseFile_(directory.file("phase-" + std::to_string(seed))) {
    process_ = daemon.startClient("churn", {"--seed", std::to_string(seed), "--hold-bytes",
                                            kHoldBytes, "--phase-file", phaseFile_});
  }
  steady_clock::time_point startedAt() const { return startedAt_; }
  Child& process() { return *process_; }
  std::uint64_t seed() const { return seed_; }
  std::string phase() const { return phaseOf(phaseFile_); }

private:
  std::uint64_t seed_;
  std::string phaseFile_;
  steady_clock::time_point startedAt_ = steady_clock::now();
  std::unique_ptr<Child> process_;
};

double percentileMs(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  auto rank = static_cast<std::size_t>(p / 100.0 * static_cast<double>(values.size() - 1) + 0.5);
  return values[rank];
}

TEST(Torture, SigkilledClientsAreReclaimedExactlyAndPromptly) {
  Daemon daemon;
  TempDir phases;
  const pid_t daemonPid = daemon.pid();
  std::mt19937_64 random(4);  // fixed: every run draws the same victims, ages and client seeds
  std::uint64_t nextSeed = 1;

  std::vector<std::unique_ptr<ChurnClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<ChurnClient>(daemon, phases, nextSeed++));
  }
  ASSERT_TRUE(eventually([&] { return snapshot(daemon).pids.size() == kClients; }))
      << daemon.status().dump(2);

  std::vector<double> reclaimMs;
  std::map<std::string, int> killsByPhase;
  for (int kill = 0; kill < kKills; ++kill) {
    auto& victim = clients[random() % clients.size()];
    std::this_thread::sleep_until(victim->startedAt() + milliseconds(random() % (kMaxAgeMs + 1)));
    // A survivor that stopped on its own hit a CUDA error or a wrong result: perhaps reclaiming
    // someone else touched its memory.
    for (auto& client : clients) {
      ASSERT_TRUE(client->process().running())
          << "churn --seed " << client->seed() << " stopped by itself:\n"
          << client->process().errors();
    }
    const pid_t victimPid = victim->process().pid();
    victim->process().signal(SIGKILL);
    const auto killedAt = steady_clock::now();

    Snapshot seen;
    bool reclaimed = false;
    auto observedAt = killedAt;
    while (steady_clock::now() - killedAt < kReclaimBound + milliseconds(3000)) {
      seen = snapshot(daemon);
      observedAt = steady_clock::now();
      ASSERT_EQ(seen.daemonPid, daemonPid) << "the daemon was replaced";
      if (seen.pids.count(victimPid) == 0 && seen.deviceUsed == seen.clientsUsed) {
        reclaimed = true;
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    ASSERT_TRUE(reclaimed) << "kill " << kill << " (churn --seed " << victim->seed() << ", in "
                           << victim->phase() << "): device memory_used " << seen.deviceUsed
                           << " but the clients hold " << seen.clientsUsed << "\n"
                           << daemon.status().dump(2);
    double ms = std::chrono::duration<double, std::milli>(observedAt - killedAt).count();
    EXPECT_LE(ms, static_cast<double>(kReclaimBound.count()))
        << "kill " << kill << " (churn --seed " << victim->seed() << ", in " << victim->phase()
        << ") took " << ms << " ms to reclaim";
    EXPECT_EQ(victim->process().wait().signal, SIGKILL);
    reclaimMs.push_back(ms);
    ++killsByPhase[victim->phase()];
    victim = std::make_unique<ChurnClient>(daemon, phases, nextSeed++);
  }

  // The daemon process is the one we started, still alive; everything comes back once nobody is
  // left.
  for (auto& client : clients) client->process().signal(SIGKILL);
  for (auto& client : clients) client->process().wait();
  eventually([&] {
    Snapshot last = snapshot(daemon);
    return last.pids.empty() && last.deviceUsed == 0;
  });
  Snapshot last = snapshot(daemon);
  EXPECT_TRUE(last.pids.empty()) << daemon.status().dump(2);
  EXPECT_EQ(last.deviceUsed, 0u) << "bytes leaked\n" << daemon.status().dump(2);
  EXPECT_EQ(last.daemonPid, daemonPid);

  std::string phasesSeen;
  for (const auto& [phase, count] : killsByPhase) {
    phasesSeen += " " + phase + "=" + std::to_string(count);
  }
  std::printf(
      "torture: %d kills, reclaim observed after p50 %.1f ms, p90 %.1f ms, max %.1f ms "
      "(includes one gpuproxyctl round trip); kills by phase:%s\n",
      kKills, percentileMs(reclaimMs, 50), percentileMs(reclaimMs, 90),
      percentileMs(reclaimMs, 100), phasesSeen.c_str());

  ExitStatus stopped = daemon.stop();
  EXPECT_TRUE(stopped.exitedWith(0)) << daemon.log();
}

}  // namespace
}  // namespace gpuproxy::testing
