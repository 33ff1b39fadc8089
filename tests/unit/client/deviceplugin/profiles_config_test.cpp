// The slot profiles an operator writes in the `device_plugin:` section of gpuproxyd's tenants
// file: what the plugin advertises, and mistakes refused with a reason before it registers.
#include "client/deviceplugin/profiles_config.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::deviceplugin {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string refusal(const std::string& yaml) {
  try {
    parseProfilesConfig(yaml, 4);
  } catch (const ProfilesConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(ProfilesConfig, WithoutASectionOnlyTheDefaultResourceIsAdvertised) {
  for (const char* yaml : {"", "tenants: []\n", "tenants: []\ndevice_plugin:\n"}) {
    auto profiles = parseProfilesConfig(yaml, 7);
    ASSERT_EQ(profiles.size(), 1u) << yaml;
    EXPECT_EQ(profiles[0].resourceName, "gpuproxy.io/gpu");
    EXPECT_EQ(profiles[0].slotsPerGpu, 7u);
    EXPECT_FALSE(profiles[0].memoryPerSlot);
  }
}

TEST(ProfilesConfig, ProfilesCarryTheirMemoryWeightAndClass) {
  auto profiles = parseProfilesConfig(R"(
tenants: []
device_plugin:
  slots_per_gpu: 8
  profiles:
    - resource: gpuproxy.io/gpu-4gb
      slots_per_gpu: 2
      memory_limit: 4GiB
      weight: 3
      class: latency-critical
    - resource: example.com/small
)",
                                      4);
  ASSERT_EQ(profiles.size(), 3u);
  EXPECT_EQ(profiles[0].slotsPerGpu, 8u);
  EXPECT_EQ(profiles[1].resourceName, "gpuproxy.io/gpu-4gb");
  EXPECT_EQ(profiles[1].slotsPerGpu, 2u);
  EXPECT_EQ(profiles[1].memoryPerSlot, 4 * kGiB);
  EXPECT_EQ(profiles[1].weightPerSlot, 3u);
  EXPECT_TRUE(profiles[1].latencyCritical);
  EXPECT_EQ(profiles[2].slotsPerGpu, 4u);
  EXPECT_FALSE(profiles[2].latencyCritical);
}

TEST(ProfilesConfig, MistakesAreRefusedWithAReason) {
  EXPECT_NE(refusal("device_plugin: [").find("not valid YAML"), std::string::npos);
  EXPECT_NE(refusal("device_plugin:\n  slots: 2\n").find("unknown key `slots`"), std::string::npos);
  EXPECT_NE(refusal("device_plugin:\n  profiles:\n    - slots_per_gpu: 2\n").find("`resource`"),
            std::string::npos);
  EXPECT_NE(refusal("device_plugin:\n  profiles:\n    - resource: gpu\n")
                .find("not an extended resource name"),
            std::string::npos);
  EXPECT_NE(
      refusal("device_plugin:\n  profiles:\n    - resource: a.io/x\n      memory_limit: lots\n")
          .find("not a size"),
      std::string::npos);
  EXPECT_NE(refusal("device_plugin:\n  profiles:\n    - resource: a.io/x\n      class: urgent\n")
                .find("class must be"),
            std::string::npos);
  EXPECT_NE(
      refusal("device_plugin:\n  profiles:\n    - resource: gpuproxy.io/gpu\n").find("given twice"),
      std::string::npos);
  EXPECT_NE(refusal("device_plugin:\n  slots_per_gpu: 0\n").find("1 or more"), std::string::npos);
}

}  // namespace
}  // namespace gpuproxy::deviceplugin
