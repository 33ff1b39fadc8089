// The file that carries run-time tenants across a restart of gpuproxyd (--state-dir): what is
// written is read back whole, and a damaged file is refused with the reason, never half-read.
#include "server/daemon/runtime_tenant_state.hpp"

#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpuproxy::server {
namespace {

SavedTenant allocationTenant() {
  SavedTenant saved;
  TenantDefinition& definition = saved.definition;
  definition.name = "alloc-7f3a";
  definition.socketPath = "/run/gpuproxy/allocations/7f3a";
  definition.origin = TenantOrigin::kRuntime;
  definition.limits.memoryLimit = 8ull << 30;
  definition.limits.pinnedMemoryLimit = 1ull << 30;
  definition.limits.weight = 2;
  definition.limits.tenantClass = TenantClass::kLatencyCritical;
  definition.limits.devices = std::vector<std::uint32_t>{1};
  definition.limits.maxConnections = 64;
  definition.limits.maxObjects[1] = 500;
  definition.allocation = {"gpuproxy.io/gpu", {"gpu1-slot0", "gpu1-slot1"}};
  saved.boundPodUid = "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6";
  saved.pod = {"team-a", "trainer-0", {"main"}};
  return saved;
}

TEST(RuntimeTenantState, WhatIsWrittenIsReadBackWhole) {
  SavedTenant plain;
  plain.definition.name = "plain";
  plain.definition.socketPath = "/srv/plain";
  plain.definition.origin = TenantOrigin::kRuntime;
  const std::vector<SavedTenant> read =
      decodeRuntimeTenants(encodeRuntimeTenants({allocationTenant(), plain}));
  ASSERT_EQ(read.size(), 2u);

  const SavedTenant expected = allocationTenant();
  const TenantDefinition& got = read[0].definition;
  EXPECT_EQ(got.name, expected.definition.name);
  EXPECT_EQ(got.socketPath, expected.definition.socketPath);
  EXPECT_EQ(got.origin, TenantOrigin::kRuntime);
  EXPECT_EQ(got.limits.memoryLimit, expected.definition.limits.memoryLimit);
  EXPECT_EQ(got.limits.pinnedMemoryLimit, expected.definition.limits.pinnedMemoryLimit);
  EXPECT_EQ(got.limits.weight, 2u);
  EXPECT_EQ(got.limits.tenantClass, TenantClass::kLatencyCritical);
  EXPECT_EQ(got.limits.devices, expected.definition.limits.devices);
  EXPECT_EQ(got.limits.maxConnections, 64u);
  EXPECT_EQ(got.limits.maxObjects, expected.definition.limits.maxObjects);
  EXPECT_EQ(got.allocation.resource, "gpuproxy.io/gpu");
  EXPECT_EQ(got.allocation.deviceIds, expected.definition.allocation.deviceIds);
  EXPECT_EQ(read[0].boundPodUid, expected.boundPodUid);
  EXPECT_EQ(read[0].pod, expected.pod);

  // What was not set stays unset: no limit, every device, no allocation, no pod.
  const SavedTenant& second = read[1];
  EXPECT_FALSE(second.definition.limits.memoryLimit);
  EXPECT_FALSE(second.definition.limits.devices);
  EXPECT_TRUE(second.definition.allocation.empty());
  EXPECT_FALSE(second.boundPodUid);
  EXPECT_TRUE(second.pod.empty());
}

TEST(RuntimeTenantState, ADamagedFileIsRefusedWithTheReason) {
  const std::string good = encodeRuntimeTenants({allocationTenant()});
  auto refusal = [](const std::string& text) {
    try {
      decodeRuntimeTenants(text);
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(good.substr(0, good.size() / 2)), "");  // cut short
  EXPECT_NE(refusal("[]"), "");                             // not an object
  EXPECT_NE(refusal(R"({"version": 2, "tenants": []})").find("version"), std::string::npos);
  EXPECT_NE(refusal(R"({"version": 1})").find("no list of tenants"), std::string::npos);
  std::string wrongClass = good;
  wrongClass.replace(wrongClass.find("latency-critical"), 16, "urgent-please");
  EXPECT_NE(refusal(wrongClass).find("urgent-please"), std::string::npos);
  std::string wrongType = good;
  wrongType.replace(wrongType.find("\"weight\": 2"), 11, "\"weight\": \"2\"");
  EXPECT_NE(refusal(wrongType).find("alloc-7f3a"), std::string::npos);
  EXPECT_TRUE(decodeRuntimeTenants(R"({"version": 1, "tenants": []})").empty());
}

TEST(RuntimeTenantState, AFileIsReplacedWhole) {
  testing::TempDir directory;
  const std::string path = directory.file(std::string(kRuntimeTenantsFile));
  replaceFile(path, "first\n");
  replaceFile(path, "second\n");
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), "second\n");
  EXPECT_THROW(replaceFile(directory.file("missing/dir/file"), "x"), std::runtime_error);
}

}  // namespace
}  // namespace gpuproxy::server
