// What gpuproxyctl status prints about a device's compute capability, stream priorities and SM
// partition, in JSON and as text, for states the sim cannot produce (a partition needs green
// contexts on a GPU).
#include "client/ctl/status_report.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <memory>

namespace gpuproxy::client {
namespace {

void fillDevice(protocol::DeviceStatus::Builder device, bool partitioned) {
  device.setIndex(0);
  device.setName("NVIDIA H100 80GB HBM3");
  device.setMemoryTotal(80ull << 30);
  device.setComputeCapability(90);
  auto range = device.initStreamPriorities();
  range.setLeast(0);
  range.setGreatest(-5);
  auto critical = device.initLatencyCriticalPriorities();
  critical.setLeast(-5);
  critical.setGreatest(-5);
  auto bestEffort = device.initBestEffortPriorities();
  bestEffort.setLeast(0);
  bestEffort.setGreatest(-4);
  device.setHasSmPartition(partitioned);
  if (partitioned) {
    auto partition = device.initSmPartition();
    partition.setTotalSms(132);
    partition.setBestEffortSms(112);
    partition.setLatencyCriticalSms(20);
  }
}

// A MallocMessageBuilder's destructor may throw, which a gtest fixture's may not: held by
// pointer.
class StatusReportTest : public ::testing::Test {
protected:
  protocol::DaemonStatus::Reader status(bool partitioned) {
    auto built = message_->initRoot<protocol::DaemonStatus>();
    built.setBackend("cuda");
    built.setScheduler("fair");
    fillDevice(built.initDevices(1)[0], partitioned);
    return built.asReader();
  }

  std::unique_ptr<capnp::MallocMessageBuilder> message_ =
      std::make_unique<capnp::MallocMessageBuilder>();
};

TEST_F(StatusReportTest, JsonShowsThePartitionWhenOn) {
  const nlohmann::json json = statusToJson(status(true));
  const nlohmann::json& device = json["devices"][0];
  EXPECT_EQ(device["sm_partition"]["total_sms"], 132);
  EXPECT_EQ(device["sm_partition"]["best_effort_sms"], 112);
  EXPECT_EQ(device["sm_partition"]["latency_critical_sms"], 20);
  EXPECT_EQ(device["stream_priorities"]["range"], nlohmann::json::array({-5, 0}));
  EXPECT_EQ(device["stream_priorities"]["latency_critical"], nlohmann::json::array({-5, -5}));
  EXPECT_EQ(device["stream_priorities"]["best_effort"], nlohmann::json::array({-4, 0}));
}

TEST_F(StatusReportTest, JsonSaysNullWithoutAPartition) {
  const nlohmann::json json = statusToJson(status(false));
  EXPECT_TRUE(json["devices"][0]["sm_partition"].is_null());
}

TEST_F(StatusReportTest, TextShowsThePartitionLineOnlyWhenOn) {
  const std::string on = statusToTable(status(true));
  EXPECT_NE(on.find("SM partition: best-effort 112 SMs, latency-critical 20 SMs (of 132)"),
            std::string::npos)
      << on;
  EXPECT_NE(on.find("stream priorities: latency-critical -5, best-effort -4..0 (device -5..0)"),
            std::string::npos)
      << on;
  const std::string off = statusToTable(status(false));
  EXPECT_EQ(off.find("SM partition"), std::string::npos) << off;
}

TEST_F(StatusReportTest, EachDeviceSaysItsComputeCapability) {
  EXPECT_EQ(statusToJson(status(false))["devices"][0]["compute_capability"], "9.0");
  const std::string text = statusToTable(status(false));
  EXPECT_NE(text.find("compute capability 9.0; stream priorities"), std::string::npos) << text;
}

}  // namespace
}  // namespace gpuproxy::client
