// A module load that takes seconds (a large PTX JIT on a GPU; here a sim device told to be that
// slow) stalls no one else: not the clients of another GPU, not the other clients of the same
// GPU, not gpuproxyctl. Nor does the reset of a GPU's context after a sticky fault, nor freeing
// what a client left behind. The daemon runs them on each GPU's blocking-call thread (with
// cuMemAlloc and cuMemFree, which may wait for the driver too), and its status and metrics count
// those calls.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>

namespace gpuproxy::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kSlowLoadMs = 4000;
constexpr int kSlowResetMs = 3000;
constexpr int kSlowFreeMs = 3000;

// The slowest round trip steady_client saw: the upper bound of its last non-empty bucket.
double slowestRoundTripUs(const std::string& output) {
  double slowest = 0;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string key;
    double upper = 0;
    unsigned long long count = 0;
    if (words >> key >> upper >> count && key == "latency_us" && count > 0) {
      slowest = std::max(slowest, upper);
    }
  }
  return slowest;
}

// A steady_client synchronising a small kernel every millisecond on `device`.
std::unique_ptr<Child> startSteadyClient(const Daemon& daemon, int device) {
  return daemon.startClient("steady_client", {"--interval-us", "1000", "--seconds", "60",
                                              "--device", std::to_string(device)});
}

// Stops a steady_client and checks that it ran without errors and never waited `slowCallMs` / 4
// or longer for a synchronise.
void expectNeverHeldUp(Child& client, int slowCallMs, const char* heldUpBy) {
  client.signal(SIGTERM);
  ExitStatus status = client.wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.exitedWith(0)) << client.errors();
  const std::map<std::string, std::string> seen = answers(client.output());
  EXPECT_EQ(seen.at("errors"), "0") << client.output();
  EXPECT_GT(std::stoull(seen.at("round_trips")), 100u) << client.output();
  EXPECT_LT(slowestRoundTripUs(client.output()), slowCallMs * 1000.0 / 4)
      << "a synchronise waited for " << heldUpBy << ":\n"
      << client.output();
}

// Status once no device has a blocking call pending any more.
nlohmann::json settledStatus(const Daemon& daemon) {
  nlohmann::json status;
  EXPECT_TRUE(eventually([&] {
    status = daemon.status();
    return std::all_of(status["devices"].begin(), status["devices"].end(), [](const auto& device) {
      return device["blocking_calls"]["pending"].template get<int>() == 0;
    });
  })) << status.dump(2);
  return status;
}

// Asks `gpuproxyctl status` again and again until `until`: it answers every time, never taking
// `slowCallMs` / 4 or longer, though `slowCall` is under way.
void expectStatusAnswersAtOnce(const Daemon& daemon, steady_clock::time_point until, int slowCallMs,
                               const char* slowCall) {
  int answers = 0;
  while (steady_clock::now() < until) {
    const auto asked = steady_clock::now();
    RunResult status = daemon.ctl({"status"});
    const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - asked);
    ASSERT_TRUE(status.status.exitedWith(0)) << status.errors;
    EXPECT_LT(took.count(), slowCallMs / 4) << "gpuproxyctl status waited for " << slowCall;
    ++answers;
  }
  EXPECT_GT(answers, 0);
}

TEST(BlockingCalls, ASlowModuleLoadStallsNoOtherClientNorTheAdminSocket) {
  Daemon::Options options;
  options.simDevices = 2;
  options.extraArguments = {"--sim-slow-module-load", "0:" + std::to_string(kSlowLoadMs)};
  Daemon daemon(options);
  // Steady clients on both GPUs, each synchronising a small kernel every millisecond. The one on
  // device 0 waits through its own slow load first; wait until both are in their loops (after
  // their module's preparation and their buffer's allocation).
  auto onSlowGpu = startSteadyClient(daemon, 0);
  auto onOtherGpu = startSteadyClient(daemon, 1);
  ASSERT_TRUE(eventually(
      [&] {
        nlohmann::json status = daemon.status();
        return status["devices"][0]["blocking_calls"]["ended"].get<int>() >= 2 &&
               status["devices"][0]["blocking_calls"]["pending"].get<int>() == 0;
      },
      std::chrono::seconds(30)))
      << daemon.log();

  // Another client loads a module on device 0: seconds of preparation.
  const auto loadStarted = steady_clock::now();
  auto loader = daemon.startClient("vector_add", {"--elements", "1024", "--device", "0"});
  EXPECT_TRUE(eventually(
      [&] { return daemon.status()["devices"][0]["blocking_calls"]["pending"].get<int>() == 1; },
      std::chrono::seconds(10)))
      << "the admin socket never answered while the module was being prepared\n"
      << daemon.log();

  // While it is being prepared, the admin socket answers at once, every time.
  expectStatusAnswersAtOnce(daemon, loadStarted + milliseconds(kSlowLoadMs - 1500), kSlowLoadMs,
                            "the module load");

  // The load itself completes, and was as slow as the device was told to be.
  ExitStatus loaded = loader->wait(std::chrono::seconds(60));
  EXPECT_TRUE(loaded.exitedWith(0)) << loader->errors() << daemon.log();
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(steady_clock::now() - loadStarted).count(),
            kSlowLoadMs);

  // Neither steady client ever waited anywhere near that long for a synchronise.
  for (auto* client : {onSlowGpu.get(), onOtherGpu.get()}) {
    expectNeverHeldUp(*client, kSlowLoadMs, "another client's module load");
  }

  // Every call is counted where it ran: on device 0 two slow preparations (the steady client's
  // and the loader's), the programs' allocations and frees (one buffer and three) and their
  // modules' unloads; on device 1 one quick preparation, one allocation, one free and one unload.
  // (An unload answers before it has run: wait for the last ones.)
  nlohmann::json status = settledStatus(daemon);
  EXPECT_EQ(status["devices"][0]["blocking_calls"]["ended"].get<int>(), 12) << status.dump(2);
  EXPECT_GE(status["devices"][0]["blocking_calls"]["seconds"].get<double>(),
            2 * kSlowLoadMs / 1000.0);
  EXPECT_EQ(status["devices"][1]["blocking_calls"]["ended"].get<int>(), 4) << status.dump(2);
  EXPECT_LT(status["devices"][1]["blocking_calls"]["seconds"].get<double>(), kSlowLoadMs / 1000.0);
}

TEST(BlockingCalls, ASlowContextResetStallsNoOtherClientNorTheAdminSocket) {
  Daemon::Options options;
  options.simDevices = 2;
  options.extraArguments = {"--sim-slow-reset", "0:" + std::to_string(kSlowResetMs)};
  Daemon daemon(options);
  auto onOtherGpu = startSteadyClient(daemon, 1);
  ASSERT_TRUE(eventually(
      [&] { return daemon.status()["devices"][1]["blocking_calls"]["ended"].get<int>() >= 1; },
      std::chrono::seconds(30)))
      << daemon.log();

  // A kernel on device 0 faults, which poisons its context; once its program has gone, the
  // context is reset, taking seconds.
  RunResult trap = daemon.runClient("error_probe", {"trap"});
  ASSERT_TRUE(trap.status.exitedWith(0)) << trap.errors;
  EXPECT_EQ(answers(trap.output)["cuCtxSynchronize"], "CUDA_ERROR_ILLEGAL_ADDRESS") << trap.output;
  const auto resetStarted = steady_clock::now();
  ASSERT_TRUE(eventually(
      [&] { return daemon.status()["devices"][0]["blocking_calls"]["pending"].get<int>() == 1; },
      std::chrono::seconds(10)))
      << daemon.log();

  // A program that starts on device 0 meanwhile gets its context once the reset is over, and
  // runs: it is neither refused with the fault it never caused nor given a context the reset
  // would destroy.
  auto newcomer = daemon.startClient("vector_add", {"--elements", "1024", "--device", "0"});

  // The admin socket answers at once all along, and shows the fault until the reset is over.
  int answersDuringTheReset = 0;
  while (steady_clock::now() - resetStarted < milliseconds(kSlowResetMs - 1500)) {
    const auto asked = steady_clock::now();
    nlohmann::json status = daemon.status();
    const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - asked);
    EXPECT_LT(took.count(), kSlowResetMs / 4) << "gpuproxyctl status waited for the reset";
    EXPECT_EQ(status["devices"][0]["sticky_error"], "CUDA_ERROR_ILLEGAL_ADDRESS") << status.dump(2);
    ++answersDuringTheReset;
  }
  EXPECT_GT(answersDuringTheReset, 0);

  ExitStatus ran = newcomer->wait(std::chrono::seconds(60));
  EXPECT_TRUE(ran.exitedWith(0)) << newcomer->output() << newcomer->errors() << daemon.log();
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(steady_clock::now() - resetStarted).count(),
            kSlowResetMs - 1000);
  nlohmann::json status = settledStatus(daemon);
  EXPECT_TRUE(status["devices"][0]["sticky_error"].is_null()) << status.dump(2);
  // Device 0's blocking calls: the reset, and the two programs' module preparations and unloads,
  // allocations and frees.
  EXPECT_EQ(status["devices"][0]["blocking_calls"]["ended"].get<int>(), 12) << status.dump(2);
  EXPECT_GE(status["devices"][0]["blocking_calls"]["seconds"].get<double>(), kSlowResetMs / 1000.0);

  // The client of the other GPU never waited anywhere near that long for a synchronise.
  expectNeverHeldUp(*onOtherGpu, kSlowResetMs, "another GPU's reset");
}

// A program killed while it holds memory leaves it to the daemon, whose free of it may wait for
// the device (cuMemFree). It runs on the GPU's blocking-call thread: meanwhile every other client
// is served, status answers and already counts the memory as free (as cuMemGetInfo does), and a
// program that needs that memory gets it, its allocation made after the free. (No program here
// runs a large kernel: a kernel holds the GPU for its clients, which is not what is measured.)
TEST(BlockingCalls, FreeingWhatAClientLeftStallsNoOtherClientNorTheAdminSocket) {
  Daemon::Options options;
  options.simDevices = 2;
  options.simMemory = "32MiB";
  options.extraArguments = {"--sim-slow-free", "0:" + std::to_string(kSlowFreeMs)};
  Daemon daemon(options);
  auto onSlowGpu = startSteadyClient(daemon, 0);
  auto onOtherGpu = startSteadyClient(daemon, 1);
  ASSERT_TRUE(eventually(
      [&] {
        nlohmann::json status = daemon.status();
        return status["devices"][0]["blocking_calls"]["ended"].get<int>() >= 2 &&
               status["devices"][1]["blocking_calls"]["ended"].get<int>() >= 2;
      },
      std::chrono::seconds(30)))
      << daemon.log();
  const auto usedBefore = daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>();

  // Three quarters of the device, held until the program is killed.
  const std::string threeQuarters = std::to_string(24 << 20);
  auto leaving = daemon.startClient("error_probe", {"alloc-and-hold", threeQuarters});
  ASSERT_TRUE(eventually([&] { return !answers(leaving->output())["pointer"].empty(); }))
      << leaving->errors() << daemon.log();
  // Taken before the kill: the daemon may start the free before the test sees the program gone.
  const auto freeStarted = steady_clock::now();
  leaving->signal(SIGKILL);
  EXPECT_EQ(leaving->wait().signal, SIGKILL);

  // The memory is the tenant's again at once, while the device is still freeing it.
  ASSERT_TRUE(eventually(
      [&] {
        nlohmann::json status = daemon.status();
        return status["devices"][0]["memory_used"].get<std::uint64_t>() == usedBefore &&
               status["devices"][0]["blocking_calls"]["pending"].get<int>() > 0;
      },
      std::chrono::seconds(10)))
      << daemon.status().dump(2) << daemon.log();
  // So a program that asks meanwhile how much is free (cuMemGetInfo) is told it is: whatever it
  // allocates from now on reaches the device after the free.
  RunResult probe = daemon.runClient("error_probe", {"alloc", "0"});
  ASSERT_TRUE(probe.status.exitedWith(0)) << probe.errors;
  EXPECT_EQ(answers(probe.output)["cuMemGetInfo"], "CUDA_SUCCESS") << probe.output;
  EXPECT_GE(std::stoull(answers(probe.output)["free"]), std::stoull(threeQuarters)) << probe.output;
  ASSERT_GT(daemon.status()["devices"][0]["blocking_calls"]["pending"].get<int>(), 0)
      << "the free ended before the probe asked how much memory is free";

  // A program that needs that memory starts now: the device has it only once the free is done.
  auto newcomer = daemon.startClient("error_probe", {"alloc", threeQuarters});
  expectStatusAnswersAtOnce(daemon, freeStarted + milliseconds(kSlowFreeMs - 1500), kSlowFreeMs,
                            "the free");
  ExitStatus ran = newcomer->wait(std::chrono::seconds(60));
  EXPECT_TRUE(ran.exitedWith(0)) << newcomer->output() << newcomer->errors() << daemon.log();
  EXPECT_EQ(answers(newcomer->output())["cuMemAlloc"], "CUDA_SUCCESS") << newcomer->output();
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(steady_clock::now() - freeStarted).count(),
            kSlowFreeMs);

  for (auto* client : {onSlowGpu.get(), onOtherGpu.get()}) {
    expectNeverHeldUp(*client, kSlowFreeMs, "the free of what another client left");
  }
  // Once every program has gone, nothing is left on the device.
  EXPECT_TRUE(eventually(
      [&] { return daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>() == 0; },
      std::chrono::seconds(20)))
      << daemon.status().dump(2);
}

// A program killed while it holds a module leaves its unload to the daemon, and cuModuleUnload
// may wait for the device as cuMemFree does: it runs on the GPU's blocking-call thread too, so
// that meanwhile every other client is served and status answers.
TEST(BlockingCalls, UnloadingTheModuleOfAClientThatWentStallsNoOtherClientNorTheAdminSocket) {
  Daemon::Options options;
  options.simDevices = 2;
  options.extraArguments = {"--sim-slow-free", "0:" + std::to_string(kSlowFreeMs)};
  Daemon daemon(options);
  auto onSlowGpu = startSteadyClient(daemon, 0);
  auto onOtherGpu = startSteadyClient(daemon, 1);
  auto leaving = startSteadyClient(daemon, 0);
  // All three in their loops: each has had its module prepared and its buffer allocated.
  ASSERT_TRUE(eventually(
      [&] {
        nlohmann::json status = daemon.status();
        return status["devices"][0]["blocking_calls"]["ended"].get<int>() >= 4 &&
               status["devices"][1]["blocking_calls"]["ended"].get<int>() >= 2;
      },
      std::chrono::seconds(30)))
      << daemon.log();
  const int endedBefore = daemon.status()["devices"][0]["blocking_calls"]["ended"].get<int>();

  leaving->signal(SIGKILL);
  EXPECT_EQ(leaving->wait().signal, SIGKILL);
  const auto unloadStarted = steady_clock::now();
  ASSERT_TRUE(eventually(
      [&] { return daemon.status()["devices"][0]["blocking_calls"]["pending"].get<int>() > 0; },
      std::chrono::seconds(10)))
      << daemon.log();
  expectStatusAnswersAtOnce(daemon, unloadStarted + milliseconds(kSlowFreeMs - 1500), kSlowFreeMs,
                            "the unload of a module a client left");

  // Its buffer's free and its module's unload both ran there, each as slow as told.
  ASSERT_TRUE(eventually(
      [&] { return daemon.status()["devices"][0]["blocking_calls"]["pending"].get<int>() == 0; },
      std::chrono::seconds(30)));
  nlohmann::json status = daemon.status();
  EXPECT_EQ(status["devices"][0]["blocking_calls"]["ended"].get<int>(), endedBefore + 2)
      << status.dump(2);
  EXPECT_GE(status["devices"][0]["blocking_calls"]["seconds"].get<double>(),
            2 * kSlowFreeMs / 1000.0);
  for (auto* client : {onSlowGpu.get(), onOtherGpu.get()}) {
    expectNeverHeldUp(*client, kSlowFreeMs, "the unload of a module another client left");
  }
}

}  // namespace
}  // namespace gpuproxy::testing
