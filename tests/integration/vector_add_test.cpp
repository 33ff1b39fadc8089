// An unmodified driver-API program runs through the stub and the daemon, and operators see it.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <set>

namespace gpuproxy::testing {
namespace {

TEST(VectorAdd, RunsEndToEndThroughTheDaemon) {
  Daemon daemon;
  RunResult result = daemon.runClient("vector_add", {"--elements", "1000000"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.log();
  EXPECT_NE(result.output.find("vector_add: OK (1000000 elements"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("gpuproxy sim device 0"), std::string::npos) << result.output;
}

TEST(VectorAdd, LeavesNothingBehindAfterFreeing) {
  Daemon daemon;
  RunResult result = daemon.runClient("vector_add", {"--elements", "4096", "--iterations", "3"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  }));
}

TEST(VectorAdd, TwoClientsAtOnceBothShowInStatus) {
  Daemon daemon;
  auto first = daemon.startClient("vector_add", {"--elements", "65536", "--hold-ms", "4000"});
  auto second = daemon.startClient("vector_add", {"--elements", "131072", "--hold-ms", "4000"});

  nlohmann::json status;
  bool bothVisible = eventually([&] {
    status = daemon.status();
    std::set<int> pids;
    for (const auto& client : status["clients"]) {
      // Past its first kernel: memory held, the launch counted and its GPU time measured.
      if (client["memory_used"].get<std::uint64_t>() > 0 && client["kernels_launched"] == 1 &&
          client["gpu_time_ns"].get<std::uint64_t>() > 0) {
        pids.insert(client["pid"].get<int>());
      }
    }
    return pids.count(first->pid()) == 1 && pids.count(second->pid()) == 1;
  });
  ASSERT_TRUE(bothVisible) << status.dump(2) << daemon.log();

  EXPECT_EQ(status["backend"], chainedCudaBackend() ? "cuda" : "sim");
  std::uint64_t sum = 0;
  for (const auto& client : status["clients"]) {
    const std::uint64_t expected = client["pid"].get<int>() == first->pid()
                                       ? 3ull * 65536 * sizeof(float)
                                       : 3ull * 131072 * sizeof(float);
    // Its three buffers, plus the module it loaded (the sim charges a module its image size; the
    // cuda backend the drop in the driver's free memory across the load, none through the chain,
    // whose sim keeps module code outside its device memory).
    if (!chainedCudaBackend()) {
      EXPECT_GT(client["module_bytes"].get<std::uint64_t>(), 0u);
    }
    EXPECT_EQ(
        client["memory_used"].get<std::uint64_t>() - client["module_bytes"].get<std::uint64_t>(),
        expected);
    EXPECT_EQ(client["device"], 0);
    EXPECT_EQ(client["kernels_launched"], 1);
    EXPECT_GT(client["gpu_time_ns"].get<std::uint64_t>(), 0u);
    EXPECT_GE(client["connected_seconds"].get<double>(), 0.0);
    sum += client["memory_used"].get<std::uint64_t>();
  }
  EXPECT_EQ(status["devices"][0]["memory_used"].get<std::uint64_t>(), sum);
  EXPECT_EQ(status["devices"][0]["memory_total"].get<std::uint64_t>(), 16ull << 30);

  EXPECT_TRUE(first->wait().exitedWith(0)) << first->errors();
  EXPECT_TRUE(second->wait().exitedWith(0)) << second->errors();
}

TEST(VectorAdd, RunsOnTheDeviceItAsksFor) {
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  auto client = daemon.startClient("vector_add", {"--device", "1", "--hold-ms", "3000"});
  nlohmann::json status;
  ASSERT_TRUE(eventually([&] {
    status = daemon.status();
    return status["devices"][1]["memory_used"].get<std::uint64_t>() > 0;
  })) << status.dump(2);
  EXPECT_EQ(status["devices"][0]["memory_used"], 0);
  EXPECT_EQ(status["clients"][0]["device"], 1);
  EXPECT_TRUE(client->wait().exitedWith(0)) << client->errors();
}

TEST(Gpuproxyctl, PrintsAReadableTable) {
  Daemon daemon;
  auto client = daemon.startClient("vector_add", {"--elements", "1024", "--hold-ms", "3000"});
  ASSERT_TRUE(eventually([&] { return daemon.status()["clients"].size() == 1; }));
  RunResult table = run({ctlBinary(), "--admin-socket", daemon.adminSocketPath(), "status"});
  ASSERT_TRUE(table.status.exitedWith(0)) << table.errors;
  EXPECT_NE(table.output.find(chainedCudaBackend() ? "backend: cuda" : "backend: sim"),
            std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("gpuproxy sim device 0"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find(std::to_string(client->pid())), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("vector_add"), std::string::npos) << table.output;
  client->wait();
}

TEST(Gpuproxyctl, SaysClearlyWhenTheDaemonIsNotThere) {
  TempDir directory;
  RunResult result =
      run({ctlBinary(), "--admin-socket", directory.file("absent.sock"), "status", "--json"});
  EXPECT_NE(result.status.code, 0);
  EXPECT_NE(result.errors.find("cannot reach gpuproxyd at " + directory.file("absent.sock")),
            std::string::npos)
      << result.errors;
}

}  // namespace
}  // namespace gpuproxy::testing
