// The device plugin's slot model: the ids the kubelet sees, which requests are refused and why,
// which slots the plugin prefers, and the limits an allocation's tenant gets.
#include "client/deviceplugin/slots.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::deviceplugin {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

const std::vector<Gpu> kTwoGpus{{0, 16 * kGiB}, {1, 16 * kGiB}};

std::string refusal(const SlotProfile& profile, const std::vector<std::string>& ids) {
  auto result = validateAllocation(profile, kTwoGpus, ids);
  auto* error = std::get_if<std::string>(&result);
  return error ? *error : "";
}

TEST(SlotIds, RoundTripAndRejectWhatIsNotASlot) {
  EXPECT_EQ(slotId({3, 12}), "gpu3-slot12");
  auto slot = parseSlotId("gpu3-slot12");
  ASSERT_TRUE(slot);
  EXPECT_EQ(slot->gpu, 3u);
  EXPECT_EQ(slot->slot, 12u);
  for (const char* bad : {"", "gpu", "gpu-slot1", "gpu1-slot", "gpu01-slot1", "gpu1-slot1x",
                          "GPU-1::1", "gpu1slot1", "gpu-1-slot1", "gpu99999999-slot0"}) {
    EXPECT_FALSE(parseSlotId(bad)) << bad;
  }
}

TEST(SlotIds, EveryIdTheKubeletSeesFitsItsLimit) {
  SlotProfile profile;
  profile.slotsPerGpu = 48;
  auto ids = advertisedSlots(profile, {{0, kGiB}, {7, kGiB}});
  ASSERT_EQ(ids.size(), 96u);
  EXPECT_EQ(ids.front(), "gpu0-slot0");
  EXPECT_EQ(ids.back(), "gpu7-slot47");
  for (const auto& id : ids) EXPECT_LE(id.size(), 63u);
}

TEST(Profiles, ResourceNamesTheKubeletRefusesAreCaught) {
  SlotProfile profile;
  EXPECT_EQ(profileError(profile), "");
  EXPECT_EQ(endpointName(profile), "gpuproxy-gpu.sock");
  profile.resourceName = "gpuproxy.io/gpu-4gb";
  EXPECT_EQ(endpointName(profile), "gpuproxy-gpu-4gb.sock");
  for (const char* bad :
       {"gpu", "/gpu", "gpuproxy.io/", "kubernetes.io/gpu", "a/b/c", "gpuproxy.io/g pu"}) {
    profile.resourceName = bad;
    EXPECT_NE(profileError(profile), "") << bad;
  }
  profile.resourceName = "gpuproxy.io/gpu";
  profile.slotsPerGpu = 0;
  EXPECT_NE(profileError(profile), "");
  profile.slotsPerGpu = 4;
  profile.weightPerSlot = 5000;
  EXPECT_NE(profileError(profile), "") << "4 slots of weight 5000 exceed the daemon's 10000";
}

TEST(Allocations, SlotsOfOneGpuAreAccepted) {
  SlotProfile profile;
  auto result = validateAllocation(profile, kTwoGpus, {"gpu1-slot3", "gpu1-slot0"});
  auto* allocation = std::get_if<Allocation>(&result);
  ASSERT_TRUE(allocation);
  EXPECT_EQ(allocation->gpu, 1u);
  EXPECT_EQ(allocation->deviceIds, (std::vector<std::string>{"gpu1-slot0", "gpu1-slot3"}));
}

TEST(Allocations, EachBadRequestIsRefusedWithItsReason) {
  SlotProfile profile;
  EXPECT_NE(refusal(profile, {"gpu0-slot0", "gpu1-slot0"}).find("spans GPUs"), std::string::npos);
  EXPECT_NE(refusal(profile, {}).find("names no device"), std::string::npos);
  EXPECT_NE(refusal(profile, {"nvidia0"}).find("is not a device id"), std::string::npos);
  EXPECT_NE(refusal(profile, {"gpu2-slot0"}).find("is not a slot"), std::string::npos);
  EXPECT_NE(refusal(profile, {"gpu0-slot4"}).find("is not a slot"), std::string::npos);
  EXPECT_NE(refusal(profile, {"gpu0-slot1", "gpu0-slot1"}).find("twice"), std::string::npos);
  EXPECT_NE(refusal(profile, {"gpu0-slot0", "gpu0-slot1", "gpu0-slot2", "gpu0-slot3", "gpu1-slot0"})
                .find("a GPU has 4"),
            std::string::npos);
}

TEST(PreferredAllocation, KeepsARequestOnOneGpu) {
  // GPU 0 has two free slots, GPU 1 three: two slots come from GPU 0 (the tighter fit), three
  // from GPU 1.
  const std::vector<std::string> available{"gpu0-slot1", "gpu0-slot3", "gpu1-slot0", "gpu1-slot1",
                                           "gpu1-slot2"};
  EXPECT_EQ(preferredAllocation(available, {}, 2),
            (std::vector<std::string>{"gpu0-slot1", "gpu0-slot3"}));
  EXPECT_EQ(preferredAllocation(available, {}, 3),
            (std::vector<std::string>{"gpu1-slot0", "gpu1-slot1", "gpu1-slot2"}));
}

TEST(PreferredAllocation, StaysWithTheGpuOfWhatMustBeIncluded) {
  const std::vector<std::string> available{"gpu0-slot0", "gpu0-slot1", "gpu1-slot0", "gpu1-slot1"};
  EXPECT_EQ(preferredAllocation(available, {"gpu1-slot1"}, 2),
            (std::vector<std::string>{"gpu1-slot1", "gpu1-slot0"}));
}

TEST(PreferredAllocation, ARequestNoGpuHoldsSpansAsFewAsItCan) {
  const std::vector<std::string> available{"gpu0-slot0", "gpu1-slot0", "gpu1-slot1", "gpu1-slot2"};
  auto chosen = preferredAllocation(available, {}, 4);
  EXPECT_EQ(chosen,
            (std::vector<std::string>{"gpu1-slot0", "gpu1-slot1", "gpu1-slot2", "gpu0-slot0"}));
}

TEST(Limits, AnAllocationGetsItsSlotsMemoryAndWeight) {
  SlotProfile share;
  share.slotsPerGpu = 4;
  share.weightPerSlot = 2;
  auto limits = limitsOf(share, {0, 16 * kGiB}, 3);
  EXPECT_EQ(limits.memoryLimit, 12 * kGiB);
  EXPECT_EQ(limits.weight, 6u);
  EXPECT_FALSE(limits.latencyCritical);

  SlotProfile fixed;
  fixed.resourceName = "gpuproxy.io/gpu-4gb";
  fixed.memoryPerSlot = 4 * kGiB;
  fixed.latencyCritical = true;
  limits = limitsOf(fixed, {0, 80 * kGiB}, 2);
  EXPECT_EQ(limits.memoryLimit, 8 * kGiB);
  EXPECT_TRUE(limits.latencyCritical);
}

TEST(TenantNames, TheSameSlotsGiveTheSameNameAndOthersAnother) {
  auto name = tenantName("gpuproxy.io/gpu", {"gpu0-slot0", "gpu0-slot1"});
  EXPECT_EQ(name, tenantName("gpuproxy.io/gpu", {"gpu0-slot0", "gpu0-slot1"}));
  EXPECT_NE(name, tenantName("gpuproxy.io/gpu", {"gpu0-slot0"}));
  EXPECT_NE(name, tenantName("gpuproxy.io/gpu-4gb", {"gpu0-slot0", "gpu0-slot1"}));
  EXPECT_NE(tenantName("r", {"ab", "c"}), tenantName("r", {"a", "bc"}));
  EXPECT_LE(name.size(), 64u);
}

}  // namespace
}  // namespace gpuproxy::deviceplugin
