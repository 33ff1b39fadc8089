// The stub's asynchronous paths end to end (tests/programs/ring_probe.cpp through the real stub
// and a real daemon): order across threads, many launching threads, large kernel arguments,
// copies larger than the staging area, errors reported at the call CUDA reports them at, and a
// client killed mid-burst. Passes with either transport (GPUPROXY_TRANSPORT=rpc or the default
// shared-memory ring); ctest runs it both ways.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>

namespace gpuproxy::testing {
namespace {

std::uint64_t deviceMemoryUsed(const Daemon& daemon) {
  return daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>();
}

class StubRing : public ::testing::Test {
protected:
  RunResult probe(std::vector<std::string> arguments,
                  std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    RunResult result = daemon_.runClient("ring_probe", std::move(arguments), timeout);
    EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon_.log();
    return result;
  }
  Daemon daemon_;
};

TEST_F(StubRing, TheTransportIsTheOneAskedFor) {
  RunResult result = daemon_.runClientOn(daemon_.socketPath(), "vector_add", {"--elements", "4096"},
                                         {{"GPUPROXY_LOG_LEVEL", "info"}});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors;
  if (rpcTransport()) {
    EXPECT_NE(result.errors.find("GPUPROXY_TRANSPORT=rpc"), std::string::npos) << result.errors;
    EXPECT_EQ(result.errors.find("data plane:"), std::string::npos) << result.errors;
  } else {
    EXPECT_NE(result.errors.find("data plane:"), std::string::npos) << result.errors;
    EXPECT_EQ(result.errors.find("no shared-memory data plane"), std::string::npos)
        << result.errors;
  }
}

// Thread A: kernel writes i on s1, event recorded on s1, condition variable to thread B; B: s2
// waits for the event, copies the value back on s2 and checks it is i. Every iteration.
TEST_F(StubRing, AnEventRecordedOnOneThreadOrdersAWaitOnAnother) {
  RunResult result = probe({"cross-thread", "400"});
  EXPECT_NE(result.output.find("cross-thread OK 400"), std::string::npos) << result.output;
}

TEST_F(StubRing, ManyThreadsLaunchingAtOnceAllLand) {
  RunResult result = probe({"many-launchers", "8", "400"});
  EXPECT_NE(result.output.find("many-launchers OK 8 x 400"), std::string::npos) << result.output;
}

TEST_F(StubRing, KernelsTakeLargeStructsByValue) {
  RunResult result = probe({"big-args"});
  EXPECT_NE(result.output.find("big-args OK"), std::string::npos) << result.output;
}

// 48 MiB each way: three times the default staging area, blocking and on a stream, at odd
// offsets, byte for byte.
TEST_F(StubRing, CopiesLargerThanTheStagingAreaArriveIntact) {
  RunResult result = probe({"staging", std::to_string(48 << 20)});
  EXPECT_NE(result.output.find("staging OK"), std::string::npos) << result.output;
}

TEST_F(StubRing, ThreadsCopyingAtOnceShareTheStagingArea) {
  RunResult result = probe({"staging-threads", "4", std::to_string((10 << 20) + 12345)});
  EXPECT_NE(result.output.find("staging-threads OK 4"), std::string::npos) << result.output;
}

TEST_F(StubRing, Memset2DSetsEveryRowAndKeepsTheDriversRules) {
  RunResult result = probe({"memset-2d"});
  EXPECT_NE(result.output.find("misaligned-pitch CUDA_ERROR_INVALID_VALUE"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("pitch-below-row CUDA_ERROR_INVALID_VALUE"), std::string::npos);
  EXPECT_NE(result.output.find("past-the-allocation CUDA_ERROR_INVALID_VALUE"), std::string::npos);
  EXPECT_NE(result.output.find("empty CUDA_SUCCESS"), std::string::npos);
  EXPECT_NE(result.output.find("synchronize CUDA_SUCCESS"), std::string::npos);
}

TEST_F(StubRing, BadArgumentsFailAtTheCallAndLeaveNothingLatched) {
  auto got = answers(probe({"sync-errors"}).output);
  EXPECT_EQ(got["launch(bad function)"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["launch(zero block)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["launch(too many threads)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["launch(bad stream)"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["launch(no parameters)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemsetD32Async(past end)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemsetD32Async(misaligned)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyDtoDAsync(past end)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyHtoDAsync(foreign)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuMemcpyDtoHAsync(past end)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuEventRecord(bad event)"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuStreamWaitEvent(bad event)"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuStreamWaitEvent(bad flags)"], "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(got["cuEventSynchronize(bad event)"], "CUDA_ERROR_INVALID_HANDLE");
  for (const char* check :
       {"launch(good)", "cuEventRecord", "cuEventSynchronize", "cuEventQuery",
        "cuStreamSynchronize", "cuStreamQuery", "cuCtxSynchronize", "cuMemcpyDtoH"}) {
    EXPECT_EQ(got[check], "CUDA_SUCCESS") << check;
  }
}

// A faulting kernel: the launch itself succeeds; the fault is the answer of the next call that
// synchronises, whichever it is. Each variant in a fresh daemon (the fault poisons the device
// until the faulting client is gone).
TEST(StubRingFaults, AnAsynchronousFaultShowsAtTheNextSynchronisingCall) {
  const std::map<std::string, std::string> variants = {{"stream-sync", "cuStreamSynchronize"},
                                                       {"ctx-sync", "cuCtxSynchronize"},
                                                       {"stream-query", "cuStreamQuery"}};
  for (const auto& [variant, call] : variants) {
    Daemon daemon;
    RunResult result = daemon.runClient("ring_probe", {"trap-async", variant});
    ASSERT_TRUE(result.status.exitedWith(0)) << variant << result.output << result.errors;
    auto got = answers(result.output);
    EXPECT_EQ(got["cuLaunchKernel(trap)"], "CUDA_SUCCESS") << variant;
    EXPECT_EQ(got[call], "CUDA_ERROR_ILLEGAL_ADDRESS") << variant << result.output;
    // The daemon recovers the device once the client has gone and serves the next one.
    EXPECT_TRUE(eventually([&] { return daemon.status()["devices"][0]["sticky_error"].is_null(); }))
        << daemon.status().dump(2);
    RunResult next = daemon.runClient("vector_add", {"--elements", "4096"});
    EXPECT_TRUE(next.status.exitedWith(0)) << next.errors;
  }
}

// Once the stub has heard of a fault, the context is unusable: asynchronous calls fail with the
// fault at the call (before, they went on answering CUDA_SUCCESS until the next synchronising
// call), on every stream, and every synchronisation keeps reporting it.
TEST(StubRingFaults, AFaultMakesEveryLaterCallOfTheContextFail) {
  Daemon daemon;
  RunResult result = daemon.runClient("ring_probe", {"fault-poisons-context"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
  auto got = answers(result.output);
  EXPECT_EQ(got["cuLaunchKernel(trap)"], "CUDA_SUCCESS");
  for (const char* call :
       {"cuLaunchKernel(after fault)", "cuMemsetD32Async(after fault)",
        "cuEventRecord(after fault)", "cuStreamQuery(untouched stream)",
        "cuStreamSynchronize(untouched stream)", "cuCtxSynchronize", "cuCtxSynchronize(again)"}) {
    EXPECT_EQ(got[call], "CUDA_ERROR_ILLEGAL_ADDRESS") << call << "\n" << result.output;
  }
}

// The first call that reports a fault (here a synchronisation's answer) makes every later call
// of the context fail with it, the very next launch included.
TEST(StubRingFaults, AFaultHeardInASynchronisationFailsTheNextLaunch) {
  Daemon daemon;
  RunResult result = daemon.runClient("ring_probe", {"fault-then-launch"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
  auto got = answers(result.output);
  EXPECT_EQ(got["cuStreamSynchronize(faulting)"], "CUDA_ERROR_ILLEGAL_ADDRESS") << result.output;
  EXPECT_EQ(got["cuLaunchKernel(right after)"], "CUDA_ERROR_ILLEGAL_ADDRESS") << result.output;
}

// SIGKILL in the middle of a launch burst: everything the victim held comes back, the survivor
// keeps exactly what it has, and the daemon goes on serving.
TEST_F(StubRing, AClientKilledWhileLaunchingIsReclaimed) {
  constexpr std::uint64_t kSurvivor = 1 << 20;
  constexpr std::uint64_t kVictim = 256 << 20;
  auto survivor = daemon_.startClient("error_probe", {"alloc-and-hold", std::to_string(kSurvivor)});
  ASSERT_TRUE(eventually([&] { return deviceMemoryUsed(daemon_) == kSurvivor; }))
      << daemon_.status().dump(2);
  auto victim = daemon_.startClient("ring_probe", {"launch-forever", std::to_string(kVictim)});
  ASSERT_TRUE(eventually([&] { return victim->output().find("launching") != std::string::npos; },
                         std::chrono::seconds(30)))
      << victim->errors();
  // Its module's memory counts too.
  EXPECT_GE(deviceMemoryUsed(daemon_), kSurvivor + kVictim) << daemon_.status().dump(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(victim->running()) << victim->errors();
  victim->signal(SIGKILL);
  EXPECT_EQ(victim->wait().signal, SIGKILL);

  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon_) == kSurvivor; }))
      << daemon_.status().dump(2);
  auto status = daemon_.status();
  ASSERT_EQ(status["clients"].size(), 1u) << status.dump(2);
  EXPECT_EQ(status["clients"][0]["pid"], survivor->pid());
  EXPECT_EQ(status["clients"][0]["memory_used"], kSurvivor);

  RunResult next = daemon_.runClient("ring_probe", {"many-launchers", "4", "100"});
  EXPECT_TRUE(next.status.exitedWith(0)) << next.errors << daemon_.log();
  RunResult vectorAdd = daemon_.runClient("vector_add", {"--elements", "4096"});
  EXPECT_TRUE(vectorAdd.status.exitedWith(0)) << vectorAdd.errors;
}

// The daemon dies while a client waits for its work: the wait ends with
// CUDA_ERROR_MPS_CONNECTION_FAILED (no hang), and so does the next call.
TEST(StubRingDaemonDeath, AWaitOnADeadDaemonFailsInsteadOfHanging) {
  auto daemon = std::make_unique<Daemon>();
  auto client = daemon->startClient("ring_probe", {"wait-on-dead-daemon"});
  ASSERT_TRUE(eventually([&] { return client->output().find("waiting") != std::string::npos; }))
      << client->errors();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  daemon->signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  ExitStatus status = client->wait(std::chrono::seconds(20));
  EXPECT_TRUE(status.exitedWith(0)) << client->output() << client->errors();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));
  auto got = answers(client->output());
  EXPECT_EQ(got["cuStreamSynchronize"], "CUDA_ERROR_MPS_CONNECTION_FAILED") << client->output();
  EXPECT_EQ(got["cuLaunchKernel(after)"], "CUDA_ERROR_MPS_CONNECTION_FAILED") << client->output();
  daemon.reset();
}

}  // namespace
}  // namespace gpuproxy::testing
