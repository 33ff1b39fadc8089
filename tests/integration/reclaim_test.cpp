// However a client ends, everything it held on the GPU comes back.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

namespace gpuproxy::testing {
namespace {

std::uint64_t deviceMemoryUsed(const Daemon& daemon, int device = 0) {
  return daemon.status()["devices"][device]["memory_used"].get<std::uint64_t>();
}

TEST(Reclaim, ClientThatExitsWithoutFreeingGetsItsMemoryReclaimed) {
  Daemon daemon;
  const std::uint64_t before = deviceMemoryUsed(daemon);
  RunResult result = daemon.runClient("vector_add", {"--elements", "262144", "--no-free"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors;
  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == before; }))
      << daemon.status().dump(2);
}

TEST(Reclaim, ClientKilledWithSigkillGetsItsMemoryReclaimed) {
  Daemon daemon;
  // A survivor whose memory must stay exactly where it is.
  auto survivor = daemon.startClient("error_probe", {"alloc-and-hold", "1048576"});
  ASSERT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 1048576; }));

  auto victim = daemon.startClient("error_probe", {"alloc-and-hold", "268435456"});
  ASSERT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 1048576 + 268435456; }))
      << daemon.status().dump(2);
  victim->signal(SIGKILL);
  EXPECT_EQ(victim->wait().signal, SIGKILL);

  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 1048576; }))
      << daemon.status().dump(2);
  auto status = daemon.status();
  ASSERT_EQ(status["clients"].size(), 1u);
  EXPECT_EQ(status["clients"][0]["pid"], survivor->pid());
  EXPECT_EQ(status["clients"][0]["memory_used"], 1048576);

  // The daemon goes on serving everyone.
  RunResult next = daemon.runClient("vector_add", {"--elements", "4096"});
  EXPECT_TRUE(next.status.exitedWith(0)) << next.errors;
}

TEST(Reclaim, AKilledClientsQueuedKernelsNeverRunAndDoNotHoldItsMemory) {
  Daemon daemon;
  auto survivor = daemon.startClient("error_probe", {"alloc-and-hold", "1048576"});
  ASSERT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 1048576; }));

  // 100 kernels of 200 ms each on one stream: 20 s of GPU work, which the scheduler hands the
  // device one kernel at a time, so almost all of it is still waiting in the daemon.
  constexpr int kKernels = 100;
  auto victim = daemon.startClient("error_probe", {"queue-and-hold", "268435456", "100", "200000"});
  ASSERT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"].get<std::uint64_t>() > 1048576 + 268435456 &&
           status["devices"][0]["kernels_queued"].get<int>() >= kKernels - 5;
  })) << daemon.status().dump(2);
  victim->signal(SIGKILL);
  EXPECT_EQ(victim->wait().signal, SIGKILL);

  // Its memory (the allocation and the module) comes back long before the queued kernels could
  // have run, because they never run: nothing of it stays queued, and its tenant is charged only
  // for the few that had already reached the device.
  ASSERT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 1048576; }))
      << daemon.status().dump(2);
  auto status = daemon.status();
  EXPECT_EQ(status["devices"][0]["kernels_queued"], 0) << status.dump(2);
  ASSERT_EQ(status["tenants"].size(), 1u);
  EXPECT_LT(status["tenants"][0]["gpu_time_ns"].get<std::uint64_t>(),
            std::uint64_t{10} * 200'000'000)
      << status.dump(2);
  ASSERT_EQ(status["clients"].size(), 1u);
  EXPECT_EQ(status["clients"][0]["pid"], survivor->pid());

  // The dropped kernels hold up nobody: the next client's kernels run.
  RunResult next = daemon.runClient("vector_add", {"--elements", "4096"});
  EXPECT_TRUE(next.status.exitedWith(0)) << next.errors;
}

TEST(Reclaim, ADaemonShutdownRemovesItsSockets) {
  auto daemon = std::make_unique<Daemon>();
  std::string socket = daemon->socketPath();
  std::string admin = daemon->adminSocketPath();
  auto client = daemon->startClient("error_probe", {"alloc-and-hold", "4096"});
  ASSERT_TRUE(eventually([&] { return daemon->status()["clients"].size() == 1; }));
  ExitStatus status = daemon->stop();
  EXPECT_TRUE(status.exitedWith(0))
      << "exit code " << status.code << ", signal " << status.signal << "\n"
      << daemon->log();
  EXPECT_NE(::access(socket.c_str(), F_OK), 0);
  EXPECT_NE(::access(admin.c_str(), F_OK), 0);
  client->signal(SIGKILL);
}

// A daemon told to stop while a client's calls are in flight: each call holds its client's
// session until the dropped connection cancels it, a turn of the event loop later. The daemon
// waits for that teardown (and does not crash in it), and the client hears its context is gone.
TEST(Reclaim, ADaemonStoppedWhileCallsAreInFlightExitsCleanly) {
  for (int round = 0; round < 20; ++round) {
    Daemon daemon;
    auto busy = daemon.startClient("error_probe", {"alloc-loop"});
    ASSERT_TRUE(eventually([&] { return busy->output().find("looping") != std::string::npos; }))
        << busy->output() << daemon.log();
    ExitStatus status = daemon.stop();
    ASSERT_TRUE(status.exitedWith(0)) << "round " << round << ": exit code " << status.code
                                      << ", signal " << status.signal << "\n"
                                      << daemon.log();
    EXPECT_NE(daemon.log().find("detached; reclaiming"), std::string::npos) << daemon.log();
    EXPECT_TRUE(busy->wait().exitedWith(0)) << busy->output() << busy->errors();
    EXPECT_NE(busy->output().find("cuMemAlloc/cuMemFree CUDA_ERROR_"), std::string::npos)
        << busy->output();
  }
}

// A kernel that never ends: while it occupies device 0, device 1 serves other clients; when its
// client is killed, the daemon stops the kernel, reclaims what the client held, and device 0
// serves again.
TEST(Reclaim, AKernelInAnInfiniteLoopIsReclaimedWhenItsClientDies) {
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  auto stuck = daemon.startClient("error_probe", {"hang"});
  ASSERT_TRUE(eventually([&] {
    return stuck->output().find("cuLaunchKernel CUDA_SUCCESS") != std::string::npos;
  })) << stuck->output()
      << daemon.log();
  // The other device is not held up.
  const RunResult other = daemon.runClient("vector_add", {"--device", "1", "--elements", "4096"});
  EXPECT_TRUE(other.status.exitedWith(0)) << other.output << other.errors << daemon.log();
  stuck->signal(SIGKILL);
  EXPECT_EQ(stuck->wait().signal, SIGKILL);
  EXPECT_TRUE(eventually([&] {
    const nlohmann::json status = daemon.status();
    return status["clients"].empty() && status["devices"][0]["memory_used"] == 0;
  })) << daemon.status().dump(2)
      << daemon.log();
  // Device 0's engine is free again.
  const RunResult after = daemon.runClient("vector_add", {"--elements", "4096"});
  EXPECT_TRUE(after.status.exitedWith(0)) << after.output << after.errors << daemon.log();
}

}  // namespace
}  // namespace gpuproxy::testing
