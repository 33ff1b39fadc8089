// gpuproxyd as an operator starts and stops it.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

namespace gpuproxy::testing {
namespace {

TEST(Daemon, SigintStopsItCleanly) {
  Daemon daemon;
  std::string socket = daemon.socketPath();
  ::kill(daemon.pid(), SIGINT);
  ExitStatus status = daemon.stop();
  EXPECT_TRUE(status.exitedWith(0)) << daemon.log();
  EXPECT_NE(::access(socket.c_str(), F_OK), 0);
  EXPECT_NE(daemon.log().find("shutting down"), std::string::npos) << daemon.log();
}

TEST(Daemon, SaysWhichBackendItChoseAndWhy) {
  TempDir directory;
  Child daemon({daemonBinary(), "--backend", "auto", "--socket", directory.file("g.sock"),
                "--admin-socket", directory.file("a.sock")});
  ASSERT_TRUE(eventually([&] {
    return daemon.errors().find("serving clients") != std::string::npos || !daemon.running();
  }));
  // This machine may or may not have a GPU: either way the log names the choice and the reason.
  std::string log = daemon.errors();
  bool namedChoice =
      log.find("backend sim: no usable GPU") != std::string::npos ||
      log.find("backend cuda: a CUDA driver and GPU are present") != std::string::npos;
  EXPECT_TRUE(namedChoice) << log;
  daemon.signal(SIGTERM);
  EXPECT_TRUE(daemon.wait().exitedWith(0)) << daemon.errors();
}

TEST(Daemon, RefusesToStartWhenTheSocketIsTaken) {
  Daemon first;
  TempDir directory;
  RunResult second = run({daemonBinary(), "--backend", "sim", "--socket", first.socketPath(),
                          "--admin-socket", directory.file("a.sock")},
                         {}, std::chrono::seconds(30));
  EXPECT_EQ(second.status.code, 1) << second.errors;
  EXPECT_NE(second.errors.find("already listening"), std::string::npos) << second.errors;
  // The first daemon is unaffected.
  EXPECT_TRUE(first.runClient("vector_add", {"--elements", "1024"}).status.exitedWith(0));
}

TEST(Daemon, RejectsBadSizesWithAUsageError) {
  RunResult result = run({daemonBinary(), "--sim-memory", "lots"});
  EXPECT_EQ(result.status.code, 2);
  EXPECT_NE(result.errors.find("--sim-memory"), std::string::npos) << result.errors;
}

TEST(Daemon, ExplainsASimulatorItCannotBuild) {
  TempDir directory;
  RunResult result = run({daemonBinary(), "--backend", "sim", "--sim-memory", "4TiB", "--socket",
                          directory.file("g.sock"), "--admin-socket", directory.file("a.sock")});
  EXPECT_EQ(result.status.code, 1) << result.errors;
  EXPECT_NE(result.errors.find("cannot start the sim backend"), std::string::npos) << result.errors;
}

TEST(Daemon, NeverMistakesTheStubForTheDriver) {
  // An LD_LIBRARY_PATH meant for clients makes the loader find the stub's libcuda.so.1.
  TempDir directory;
  RunResult result = run({daemonBinary(), "--backend", "cuda", "--socket", directory.file("g.sock"),
                          "--admin-socket", directory.file("a.sock")},
                         {{"LD_LIBRARY_PATH", stubDirectory()}});
  EXPECT_EQ(result.status.code, 1) << result.errors;
  EXPECT_NE(result.errors.find("loaded the gpuproxy stub instead of the NVIDIA driver"),
            std::string::npos)
      << result.errors;
  EXPECT_NE(result.errors.find("cuda backend unavailable"), std::string::npos) << result.errors;
}

TEST(Daemon, RefusesAnSmPartitionOnTheSimulator) {
  TempDir directory;
  for (const char* value : {"64", "50%"}) {
    RunResult result =
        run({daemonBinary(), "--backend", "sim", "--best-effort-sms", value, "--socket",
             directory.file("g.sock"), "--admin-socket", directory.file("a.sock")},
            {}, std::chrono::seconds(30));
    EXPECT_EQ(result.status.code, 1) << result.errors;
    EXPECT_NE(result.errors.find("--best-effort-sms needs the cuda backend"), std::string::npos)
        << result.errors;
  }
}

TEST(Daemon, RejectsAMeaninglessBestEffortShareWithAUsageError) {
  for (const char* value : {"0", "0%", "100%", "-8", "8.5", "lots", "%"}) {
    RunResult result = run({daemonBinary(), "--best-effort-sms", value});
    EXPECT_EQ(result.status.code, 2) << value;
    EXPECT_NE(result.errors.find("--best-effort-sms"), std::string::npos) << result.errors;
  }
}

TEST(Daemon, ReportsStreamPriorityBandsAndNoPartition) {
  Daemon daemon;
  auto status = daemon.status();
  ASSERT_EQ(status["devices"].size(), 1u);
  const auto& device = status["devices"][0];
  // [greatest, least], as CUDA numbers them.
  EXPECT_EQ(device["stream_priorities"]["range"], nlohmann::json::array({-5, 0}));
  EXPECT_EQ(device["stream_priorities"]["latency_critical"], nlohmann::json::array({-5, -5}));
  EXPECT_EQ(device["stream_priorities"]["best_effort"], nlohmann::json::array({-4, 0}));
  EXPECT_TRUE(device["sm_partition"].is_null());

  RunResult text = daemon.ctl({"status"});
  EXPECT_TRUE(text.status.exitedWith(0)) << text.errors;
  EXPECT_NE(text.output.find("stream priorities: latency-critical -5, best-effort -4..0"),
            std::string::npos)
      << text.output;
  EXPECT_EQ(text.output.find("SM partition"), std::string::npos) << text.output;
}

// A CUDA program asking about priorities gets the driver's answers: the device's range, and each
// stream's requested priority clamped into it (whatever band the daemon runs it in).
TEST(Daemon, TheStubAnswersStreamPriorityQueriesAsTheDriverDoes) {
  Daemon daemon;
  RunResult result = daemon.runClient("error_probe", {"stream-properties"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
  std::map<std::string, std::string> got;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.rfind(' ');
    if (space != std::string::npos) got[line.substr(0, space)] = line.substr(space + 1);
  }
  EXPECT_EQ(got["cuCtxGetStreamPriorityRange"], "CUDA_SUCCESS");
  EXPECT_EQ(got["least"], "0");
  EXPECT_EQ(got["greatest"], "-5");
  EXPECT_EQ(got["priority(highest)"], "-5");
  EXPECT_EQ(got["priority(lowest)"], "0");
  EXPECT_EQ(got["priority(default)"], "0");
  EXPECT_EQ(got["flags(highest)"], "1");  // CU_STREAM_NON_BLOCKING
  EXPECT_EQ(got["same-context(lowest)"], "1");
  EXPECT_EQ(got["priority(NULL)"], "0");
  EXPECT_EQ(got["flags(NULL)"], "0");
  EXPECT_EQ(got["cuStreamGetPriority(bad stream)"], "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(got["cuStreamGetPriority(no result)"], "CUDA_ERROR_INVALID_VALUE");
}

TEST(Daemon, ReportsSimulatedMemoryExactly) {
  Daemon::Options options;
  options.simMemory = "2GiB";
  options.simDevices = 3;
  Daemon daemon(options);
  auto status = daemon.status();
  ASSERT_EQ(status["devices"].size(), 3u);
  for (const auto& device : status["devices"]) {
    EXPECT_EQ(device["memory_total"], 2ull << 30);
    EXPECT_EQ(device["memory_used"], 0);
  }
}

}  // namespace
}  // namespace gpuproxy::testing
