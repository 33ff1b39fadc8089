// The tenants file: what it accepts, and a one-line reason for everything it refuses.
#include "server/tenant/tenant_config.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::server {
namespace {

constexpr const char* kMain = "/run/gpuproxy/gpuproxy.sock";

std::string refusal(const std::string& yaml) {
  try {
    parseTenantConfig(yaml, kMain, 2);
  } catch (const TenantConfigError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(TenantConfig, ReadsEveryKeyAndAddsTheDefaultTenant) {
  auto config = parseTenantConfig(R"(
tenants:
  - name: team-a
    socket: /run/gpuproxy/tenants/team-a/gpuproxy.sock
    memory_limit: 4GiB
    weight: 2
    class: latency-critical
    devices: [1, 0, 1]
    pinned_memory_limit: 512MiB
)",
                                  kMain, 2);
  ASSERT_EQ(config.tenants.size(), 2u);
  const TenantDefinition& a = config.tenants[0];
  EXPECT_EQ(a.name, "team-a");
  EXPECT_EQ(a.socketPath, "/run/gpuproxy/tenants/team-a/gpuproxy.sock");
  EXPECT_EQ(a.limits.memoryLimit, 4ull << 30);
  EXPECT_EQ(a.limits.weight, 2u);
  EXPECT_EQ(a.limits.tenantClass, TenantClass::kLatencyCritical);
  EXPECT_EQ(a.limits.devices, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(a.limits.pinnedMemoryLimit, 512ull << 20);
  EXPECT_EQ(config.tenants[1].name, "default");
  EXPECT_EQ(config.tenants[1].socketPath, kMain);
  EXPECT_FALSE(config.tenants[1].limits.memoryLimit);
  EXPECT_FALSE(config.tenants[1].limits.pinnedMemoryLimit);
}

TEST(TenantConfig, ANamedDefaultTenantServesTheMainSocketWithItsOwnLimits) {
  auto config =
      parseTenantConfig("tenants:\n  - name: default\n    memory_limit: 1GiB\n", kMain, 1);
  ASSERT_EQ(config.tenants.size(), 1u);
  EXPECT_EQ(config.tenants[0].socketPath, kMain);
  EXPECT_EQ(config.tenants[0].limits.memoryLimit, 1ull << 30);
}

// The device plugin reads its slot profiles from the same file; the daemon leaves them alone.
TEST(TenantConfig, TheDevicePluginsSectionIsLeftToThePlugin) {
  auto config = parseTenantConfig(
      "tenants: []\ndevice_plugin:\n  slots_per_gpu: 2\n  profiles:\n"
      "    - resource: gpuproxy.io/gpu-4gb\n      memory_limit: 4GiB\n",
      kMain, 1);
  // As without the section: the implicit `default` tenant alone.
  ASSERT_EQ(config.tenants.size(), 1u);
  EXPECT_EQ(config.tenants[0].name, "default");
}

TEST(TenantConfig, RefusesMistakesWithAReason) {
  EXPECT_NE(refusal("tenants: [").find("not valid YAML"), std::string::npos);
  EXPECT_NE(refusal("tennants: []").find("expected a top-level `tenants:`"), std::string::npos);
  EXPECT_NE(refusal("tenants: []\nextra: 1").find("unknown top-level key `extra`"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - socket: /a\n").find("needs a `name`"), std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a b\n    socket: /a\n").find("names use"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n").find("`socket` is required"), std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: rel/path\n").find("absolute"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    memory_limit: lots\n")
                .find("'lots' is not a size"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    pinned_memory_limit: x\n")
                .find("`pinned_memory_limit` 'x' is not a size"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    weight: 0\n").find("`weight`"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    class: urgent\n")
                .find("`class` 'urgent' is neither best-effort nor latency-critical"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    max_connections: 0\n")
                .find("`max_connections` must be between 1 and 65536"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    max_connections: many\n")
                .find("`max_connections` must be a whole number"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    devices: [2]\n")
                .find("device 2 does not exist"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    memory_limt: 1GiB\n")
                .find("unknown key `memory_limt`"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n  - name: a\n    socket: /b\n")
                .find("defined twice"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n  - name: b\n    socket: /a\n")
                .find("given to two tenants"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    line: 3\n").find("line 2"),
            std::string::npos);
}

TEST(TenantConfig, ATenantMayHaveItsOwnConnectionLimit) {
  TenantConfig config = parseTenantConfig(
      "tenants:\n  - name: a\n    socket: /a\n    max_connections: 12\n"
      "  - name: b\n    socket: /b\n",
      kMain, 1);
  EXPECT_EQ(config.tenants[0].limits.maxConnections, 12u);
  EXPECT_FALSE(config.tenants[1].limits.maxConnections.has_value());
}

TEST(TenantConfig, ObjectCapsAreReadAndCheckedPerKind) {
  TenantConfig config = parseTenantConfig(
      "tenants:\n  - name: a\n    socket: /a\n    max_streams: 12\n    max_modules: 3\n", kMain, 1);
  Tenant tenant(1, config.tenants[0]);
  EXPECT_EQ(tenant.objectLimit(TenantObject::kStream), 12u);
  EXPECT_EQ(tenant.objectLimit(TenantObject::kModule), 3u);
  EXPECT_EQ(tenant.objectLimit(TenantObject::kEvent), 65536u);  // the default
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    max_events: 0\n")
                .find("`max_events` must be between 1 and 1000000"),
            std::string::npos);
  EXPECT_NE(refusal("tenants:\n  - name: a\n    socket: /a\n    max_contexts: lots\n")
                .find("`max_contexts` must be a whole number"),
            std::string::npos);
}

// A hold counts one object against the tenant's cap until it goes, moved or not.
TEST(Tenant, ObjectHoldsCountAgainstTheCapUntilTheyGo) {
  TenantLimits limits;
  limits.maxObjects[static_cast<std::size_t>(TenantObject::kStream)] = 2;
  auto tenant = std::make_shared<Tenant>(1, TenantDefinition{"t", "/s", limits});
  auto first = TenantObjectHold::take(tenant, TenantObject::kStream);
  auto second = TenantObjectHold::take(tenant, TenantObject::kStream);
  ASSERT_TRUE(first && second);
  EXPECT_FALSE(TenantObjectHold::take(tenant, TenantObject::kStream));
  EXPECT_TRUE(TenantObjectHold::take(tenant, TenantObject::kEvent));  // another kind
  TenantObjectHold moved = std::move(*first);
  first.reset();
  EXPECT_EQ(tenant->objectsHeld(TenantObject::kStream), 2u);
  second.reset();
  EXPECT_EQ(tenant->objectsHeld(TenantObject::kStream), 1u);
  moved = TenantObjectHold();
  EXPECT_EQ(tenant->objectsHeld(TenantObject::kStream), 0u);
  EXPECT_EQ(tenant->objectsHeld(TenantObject::kEvent), 0u);
}

TEST(Tenant, ChargesWithinTheLimitAndCountsRefusals) {
  Tenant tenant(
      1, TenantDefinition{"t", "/s", TenantLimits{1000, 1, TenantClass::kBestEffort, {}, {}}});
  EXPECT_TRUE(tenant.tryCharge(0, 600));
  EXPECT_FALSE(tenant.tryCharge(0, 401));
  EXPECT_TRUE(tenant.tryCharge(1, 1000));  // per device
  EXPECT_FALSE(tenant.tryCharge(0, UINT64_MAX));
  EXPECT_EQ(tenant.oomCount, 2u);
  EXPECT_EQ(tenant.memoryUsed(), 1600u);
  auto info = tenant.memoryInfo(0, 250);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->first, 250u);  // capped by what the device really has free
  EXPECT_EQ(info->second, 1000u);
  tenant.credit(0, 600);
  EXPECT_EQ(tenant.memoryUsed(0), 0u);
}

TEST(Tenant, ChargesPinnedMemoryAgainstItsOwnLimit) {
  TenantLimits limits;
  limits.pinnedMemoryLimit = 8192;
  Tenant tenant(1, TenantDefinition{"t", "/s", limits});
  EXPECT_TRUE(tenant.tryChargePinned(4096));
  EXPECT_FALSE(tenant.tryChargePinned(8192));
  EXPECT_FALSE(tenant.tryChargePinned(UINT64_MAX));
  EXPECT_TRUE(tenant.tryChargePinned(4096));
  EXPECT_EQ(tenant.pinnedMemoryUsed(), 8192u);
  EXPECT_EQ(tenant.oomCount, 2u);
  EXPECT_EQ(tenant.memoryUsed(), 0u);  // device memory is a separate account
  tenant.creditPinned(8192);
  EXPECT_EQ(tenant.pinnedMemoryUsed(), 0u);
  Tenant unlimited(2, TenantDefinition{"u", "/u", TenantLimits{}});
  EXPECT_TRUE(unlimited.tryChargePinned(std::uint64_t{1} << 40));
}

}  // namespace
}  // namespace gpuproxy::server
