// The Prometheus text rendering of a daemon status: exact lines, escaping, and a format check of
// every line, so a scrape can never be rejected by Prometheus for syntax.

#include "server/metrics/prometheus_text.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace gpuproxy::server {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kMiB = 1ull << 20;

void fillExample(protocol::DaemonStatus::Builder status) {
  status.setBackend("sim");
  status.setVersion("0.3.0");
  status.setPid(4242);
  status.setUptimeSeconds(12.5);
  status.setDriverVersion(12040);
  status.setScheduler("fair");

  auto devices = status.initDevices(2);
  devices[0].setIndex(0);
  devices[0].setName("NVIDIA H100 80GB HBM3");
  devices[0].setMemoryTotal(80 * kGiB);
  devices[0].setMemoryUsed(3 * kGiB);
  devices[0].setClients(2);
  devices[0].setKernelsQueued(7);
  devices[0].setKernelsInFlight(2);
  devices[0].setBlockingCalls(3);
  devices[0].setBlockingCallNanoseconds(4'250'000'000);
  devices[0].setBlockingCallsPending(1);
  devices[1].setIndex(1);
  devices[1].setName("sim \"fast\" \\ GPU\nrev2");  // every character that needs escaping
  devices[1].setMemoryTotal(16 * kGiB);
  devices[1].setMemoryUsed(0);
  devices[1].setClients(0);
  devices[1].setStickyError(700);
  devices[1].setFaultingClientPid(77);

  auto clients = status.initClients(3);
  for (unsigned i = 0; i < clients.size(); ++i) clients[i].setPid(100 + i);

  auto tenants = status.initTenants(2);
  auto teamA = tenants[0];
  teamA.setName("team-a");
  teamA.setHasMemoryLimit(true);
  teamA.setMemoryLimit(4 * kGiB);
  teamA.setMemoryUsed(2 * kGiB + 512 * kMiB);
  auto perDevice = teamA.initMemoryUsedPerDevice(2);
  perDevice.set(0, 2 * kGiB + 512 * kMiB);
  perDevice.set(1, 0);
  teamA.setWeight(2);
  teamA.setClass(protocol::TenantClass::BEST_EFFORT);
  teamA.setClients(2);
  teamA.setKernelsLaunched(1234);
  teamA.setGpuTimeNs(1'500'000'000);
  teamA.setOomCount(3);
  teamA.setGpuTimeNs10s(750'000'000);
  teamA.setGpuShare10s(0.75);
  teamA.setPinnedMemoryUsed(64 * kMiB);
  teamA.setHasPinnedMemoryLimit(true);
  teamA.setPinnedMemoryLimit(256 * kMiB);
  auto serving = tenants[1];
  serving.setName("serving");
  serving.setHasMemoryLimit(false);
  serving.setMemoryUsed(512 * kMiB);
  serving.initMemoryUsedPerDevice(1).set(0, 512 * kMiB);
  serving.setWeight(1);
  serving.setClass(protocol::TenantClass::LATENCY_CRITICAL);
  serving.setClients(1);
  serving.setKernelsLaunched(0);
  serving.setGpuTimeNs(42);
  serving.setOomCount(0);
}

std::string renderExample() {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<protocol::DaemonStatus>();
  fillExample(status);
  return renderPrometheus(status.asReader());
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool hasLine(const std::string& text, const std::string& line) {
  for (const std::string& candidate : linesOf(text)) {
    if (candidate == line) return true;
  }
  return false;
}

TEST(PrometheusText, EscapesLabelValues) {
  EXPECT_EQ(escapeLabelValue("plain-name_1.0"), "plain-name_1.0");
  EXPECT_EQ(escapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(escapeLabelValue("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(escapeLabelValue("two\nlines"), "two\\nlines");
  EXPECT_EQ(escapeLabelValue(""), "");
}

TEST(PrometheusText, DaemonAndDeviceLines) {
  std::string text = renderExample();
  for (const char* line : {
           "# HELP gpuproxy_info Always 1; labelled with the daemon's backend and version.",
           "# TYPE gpuproxy_info gauge",
           "gpuproxy_info{backend=\"sim\",version=\"0.3.0\"} 1",
           "# TYPE gpuproxy_scheduler_info gauge",
           "gpuproxy_scheduler_info{scheduler=\"fair\"} 1",
           "# TYPE gpuproxy_uptime_seconds gauge",
           "gpuproxy_uptime_seconds 12.5",
           "# TYPE gpuproxy_clients gauge",
           "gpuproxy_clients 3",
           "# TYPE gpuproxy_device_memory_used_bytes gauge",
           "gpuproxy_device_memory_used_bytes{device=\"0\",name=\"NVIDIA H100 80GB HBM3\"} "
           "3221225472",
           "gpuproxy_device_memory_used_bytes{device=\"1\",name=\"sim \\\"fast\\\" \\\\ "
           "GPU\\nrev2\"} 0",
           "# TYPE gpuproxy_device_memory_total_bytes gauge",
           "gpuproxy_device_memory_total_bytes{device=\"0\",name=\"NVIDIA H100 80GB HBM3\"} "
           "85899345920",
           "gpuproxy_device_clients{device=\"0\"} 2",
           "gpuproxy_device_clients{device=\"1\"} 0",
           "# TYPE gpuproxy_device_poisoned gauge",
           "gpuproxy_device_poisoned{device=\"0\"} 0",
           "gpuproxy_device_poisoned{device=\"1\"} 1",
           "# TYPE gpuproxy_device_kernels_queued gauge",
           "gpuproxy_device_kernels_queued{device=\"0\"} 7",
           "gpuproxy_device_kernels_in_flight{device=\"0\"} 2",
           "# TYPE gpuproxy_device_blocking_calls_total counter",
           "gpuproxy_device_blocking_calls_total{device=\"0\"} 3",
           "gpuproxy_device_blocking_calls_total{device=\"1\"} 0",
           "# TYPE gpuproxy_device_blocking_call_seconds_total counter",
           "gpuproxy_device_blocking_call_seconds_total{device=\"0\"} 4.25",
           "# TYPE gpuproxy_device_blocking_calls_pending gauge",
           "gpuproxy_device_blocking_calls_pending{device=\"0\"} 1",
       }) {
    EXPECT_TRUE(hasLine(text, line)) << "missing line: " << line << "\nin:\n" << text;
  }
}

TEST(PrometheusText, TenantLines) {
  std::string text = renderExample();
  for (const char* line : {
           "gpuproxy_tenant_info{tenant=\"team-a\",class=\"best-effort\"} 1",
           "gpuproxy_tenant_info{tenant=\"serving\",class=\"latency-critical\"} 1",
           "# TYPE gpuproxy_tenant_memory_used_bytes gauge",
           "gpuproxy_tenant_memory_used_bytes{tenant=\"team-a\"} 2684354560",
           "gpuproxy_tenant_memory_used_bytes{tenant=\"serving\"} 536870912",
           "gpuproxy_tenant_device_memory_used_bytes{tenant=\"team-a\",device=\"0\"} 2684354560",
           "gpuproxy_tenant_device_memory_used_bytes{tenant=\"team-a\",device=\"1\"} 0",
           "gpuproxy_tenant_device_memory_used_bytes{tenant=\"serving\",device=\"0\"} 536870912",
           "# TYPE gpuproxy_tenant_memory_limit_bytes gauge",
           "gpuproxy_tenant_memory_limit_bytes{tenant=\"team-a\"} 4294967296",
           "# TYPE gpuproxy_tenant_pinned_memory_used_bytes gauge",
           "gpuproxy_tenant_pinned_memory_used_bytes{tenant=\"team-a\"} 67108864",
           "gpuproxy_tenant_pinned_memory_used_bytes{tenant=\"serving\"} 0",
           "gpuproxy_tenant_pinned_memory_limit_bytes{tenant=\"team-a\"} 268435456",
           "gpuproxy_tenant_clients{tenant=\"team-a\"} 2",
           "gpuproxy_tenant_clients{tenant=\"serving\"} 1",
           "gpuproxy_tenant_weight{tenant=\"team-a\"} 2",
           "# TYPE gpuproxy_tenant_kernels_launched_total counter",
           "gpuproxy_tenant_kernels_launched_total{tenant=\"team-a\"} 1234",
           "gpuproxy_tenant_kernels_launched_total{tenant=\"serving\"} 0",
           "# TYPE gpuproxy_tenant_gpu_time_seconds_total counter",
           "gpuproxy_tenant_gpu_time_seconds_total{tenant=\"team-a\"} 1.5",
           "gpuproxy_tenant_gpu_time_seconds_total{tenant=\"serving\"} 0.000000042",
           "# TYPE gpuproxy_tenant_gpu_share_10s gauge",
           "gpuproxy_tenant_gpu_share_10s{tenant=\"team-a\"} 0.75",
           "gpuproxy_tenant_gpu_share_10s{tenant=\"serving\"} 0",
           "# TYPE gpuproxy_tenant_allocation_failures_total counter",
           "gpuproxy_tenant_allocation_failures_total{tenant=\"team-a\",reason=\"limit\"} 3",
           "gpuproxy_tenant_allocation_failures_total{tenant=\"serving\",reason=\"limit\"} 0",
       }) {
    EXPECT_TRUE(hasLine(text, line)) << "missing line: " << line << "\nin:\n" << text;
  }
  // A tenant without a limit has no limit sample (not a 0 that would read as "no memory").
  EXPECT_EQ(text.find("gpuproxy_tenant_memory_limit_bytes{tenant=\"serving\"}"), std::string::npos);
  EXPECT_EQ(text.find("gpuproxy_tenant_pinned_memory_limit_bytes{tenant=\"serving\"}"),
            std::string::npos);
}

// Parses the whole exposition the way Prometheus's text parser would, and checks the format's
// rules: HELP and TYPE once per family and before its samples, families contiguous, counters
// named _total, names prefixed gpuproxy_, values numeric, label values properly escaped.
TEST(PrometheusText, EveryLineParses) {
  std::string text = renderExample();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');

  const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
  const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+))");
  // One label: name="value", the value made of plain characters or the three escapes.
  const std::regex label(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)\"(,|$))");
  const std::regex number(R"([-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|NaN|Inf))");

  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::set<std::string> finished;  // families whose samples are over
  std::string current;
  std::set<std::string> seenSeries;
  int samples = 0;
  for (const std::string& line : linesOf(text)) {
    SCOPED_TRACE(line);
    std::smatch match;
    std::string family;
    if (std::regex_match(line, match, help)) {
      family = match[1];
      EXPECT_TRUE(helped.insert(family).second) << "second HELP";
      EXPECT_FALSE(types.count(family)) << "HELP after TYPE";
    } else if (std::regex_match(line, match, type)) {
      family = match[1];
      EXPECT_TRUE(types.emplace(family, match[2]).second) << "second TYPE";
      EXPECT_TRUE(helped.count(family)) << "TYPE without HELP";
    } else if (std::regex_match(line, match, sample)) {
      family = match[1];
      ++samples;
      ASSERT_TRUE(types.count(family)) << "sample before its TYPE";
      if (types[family] == "counter") {
        EXPECT_TRUE(family.ends_with("_total")) << "counter not named _total";
      }
      std::string labels = match[3];
      std::set<std::string> names;
      for (std::sregex_iterator it(labels.begin(), labels.end(), label), end; it != end; ++it) {
        EXPECT_TRUE(names.insert((*it)[1]).second) << "label repeated";
      }
      // The label regex must consume the whole label text: nothing unparsed in between.
      std::string rebuilt = std::regex_replace(labels, label, "");
      EXPECT_EQ(rebuilt, "") << "unparsable labels";
      EXPECT_TRUE(std::regex_match(std::string(match[4]), number)) << "bad value";
      EXPECT_TRUE(seenSeries.insert(family + "{" + labels + "}").second) << "duplicate series";
    } else {
      ADD_FAILURE() << "line is neither HELP, TYPE nor a sample";
      continue;
    }
    EXPECT_TRUE(family.starts_with("gpuproxy_"));
    if (family != current) {
      EXPECT_FALSE(finished.count(family)) << "family split in two";
      if (!current.empty()) finished.insert(current);
      current = family;
    }
  }
  EXPECT_EQ(samples, 45);  // 4 daemon, 9 x 2 device, 23 tenant
}

TEST(PrometheusText, EmptyDaemonStillRendersItsOwnLines) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<protocol::DaemonStatus>();
  status.setBackend("cuda");
  status.setVersion("1.0");
  std::string text = renderPrometheus(status.asReader());
  EXPECT_TRUE(hasLine(text, "gpuproxy_info{backend=\"cuda\",version=\"1.0\"} 1"));
  EXPECT_TRUE(hasLine(text, "gpuproxy_clients 0"));
  EXPECT_TRUE(hasLine(text, "gpuproxy_uptime_seconds 0"));
  // Families without samples leave no header behind.
  EXPECT_EQ(text.find("gpuproxy_device_"), std::string::npos) << text;
  EXPECT_EQ(text.find("gpuproxy_tenant_"), std::string::npos) << text;
}

TEST(PrometheusText, LimitFamilyAbsentWhenNoTenantIsLimited) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<protocol::DaemonStatus>();
  status.initTenants(1)[0].setName("default");
  std::string text = renderPrometheus(status.asReader());
  EXPECT_TRUE(hasLine(text, "gpuproxy_tenant_memory_used_bytes{tenant=\"default\"} 0"));
  EXPECT_EQ(text.find("gpuproxy_tenant_memory_limit_bytes"), std::string::npos) << text;
}

TEST(PrometheusText, GpuTimeIsExactSeconds) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<protocol::DaemonStatus>();
  auto tenants = status.initTenants(3);
  tenants[0].setName("a");
  tenants[0].setGpuTimeNs(0);
  tenants[1].setName("b");
  tenants[1].setGpuTimeNs(123'456'789'012);
  tenants[2].setName("c");
  tenants[2].setGpuTimeNs(UINT64_MAX);
  std::string text = renderPrometheus(status.asReader());
  EXPECT_TRUE(hasLine(text, "gpuproxy_tenant_gpu_time_seconds_total{tenant=\"a\"} 0"));
  EXPECT_TRUE(hasLine(text, "gpuproxy_tenant_gpu_time_seconds_total{tenant=\"b\"} 123.456789012"));
  EXPECT_TRUE(
      hasLine(text, "gpuproxy_tenant_gpu_time_seconds_total{tenant=\"c\"} 18446744073.709551615"));
}

}  // namespace
}  // namespace gpuproxy::server
