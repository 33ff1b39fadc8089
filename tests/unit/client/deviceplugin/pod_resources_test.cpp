// Which pod the PodResources listing says holds an allocation's slots: the name gpuproxyctl
// status shows, and the sign that an allocation's pod is gone when there is none.
#include "client/deviceplugin/pod_resources.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::deviceplugin {
namespace {

AllocationTenant tenantOf(std::vector<std::string> ids) {
  AllocationTenant tenant;
  tenant.name = "k8s-0";
  tenant.resource = "gpuproxy.io/gpu";
  tenant.deviceIds = std::move(ids);
  return tenant;
}

TEST(PodHolding, NamesThePodAndEveryContainerHoldingTheSlots) {
  const std::vector<ContainerDevices> listing{
      {"ml", "trainer-0", "init", "gpuproxy.io/gpu", {"gpu0-slot0", "gpu0-slot1"}},
      {"ml", "trainer-0", "main", "gpuproxy.io/gpu", {"gpu0-slot0"}},
      {"web", "api-1", "main", "gpuproxy.io/gpu", {"gpu1-slot0"}},
  };
  auto pod = podHolding(tenantOf({"gpu0-slot0", "gpu0-slot1"}), listing);
  ASSERT_TRUE(pod);
  EXPECT_EQ(pod->podNamespace, "ml");
  EXPECT_EQ(pod->podName, "trainer-0");
  EXPECT_EQ(pod->containers, (std::vector<std::string>{"init", "main"}));
}

TEST(PodHolding, NoPodWhenTheSlotsAreListedForNoOneOrForAnotherResource) {
  const std::vector<ContainerDevices> listing{
      {"ml", "trainer-0", "main", "gpuproxy.io/gpu-4gb", {"gpu0-slot0"}},
      {"web", "api-1", "main", "gpuproxy.io/gpu", {"gpu1-slot0"}},
  };
  EXPECT_FALSE(podHolding(tenantOf({"gpu0-slot0"}), listing));
  EXPECT_FALSE(podHolding(tenantOf({"gpu0-slot0"}), {}));
}

}  // namespace
}  // namespace gpuproxy::deviceplugin
