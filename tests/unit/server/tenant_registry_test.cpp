// The daemon's tenants by name and id: ids are given once and never again.
#include "server/tenant/tenant_registry.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace gpuproxy::server {
namespace {

TenantDefinition named(const std::string& name) {
  return TenantDefinition{name, "/run/" + name + "/gpuproxy.sock", TenantLimits{}};
}

TEST(TenantRegistry, GivesEachTenantAnIdNoOtherTenantGets) {
  TenantRegistry registry;
  auto first = registry.add(named("a"));
  auto second = registry.add(named("b"));
  EXPECT_NE(first->id(), 0u);
  EXPECT_NE(first->id(), second->id());
  const TenantId removedId = first->id();
  EXPECT_EQ(registry.remove("a"), first);
  auto again = registry.add(named("a"));
  EXPECT_NE(again->id(), removedId);
  EXPECT_NE(again->id(), second->id());
  EXPECT_EQ(registry.find(again->id()), again);
  EXPECT_EQ(registry.find(removedId), nullptr);
}

TEST(TenantRegistry, NamesAreUnique) {
  TenantRegistry registry;
  registry.add(named("a"));
  EXPECT_THROW(registry.add(named("a")), std::invalid_argument);
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_EQ(registry.remove("missing"), nullptr);
}

TEST(TenantRegistry, ARemovedTenantLivesOnForThoseWhoHoldIt) {
  TenantRegistry registry;
  std::shared_ptr<Tenant> held = registry.add(named("a"));
  ASSERT_TRUE(held->tryCharge(0, 100));
  registry.remove("a");
  EXPECT_EQ(registry.find("a"), nullptr);
  EXPECT_EQ(held->memoryUsed(), 100u);
}

}  // namespace
}  // namespace gpuproxy::server
