#include "client/deviceplugin/profiles_config.hpp"

#include "protocol/byte_size.hpp"

#include <yaml-cpp/yaml.h>

#include <set>

namespace gpuproxy::deviceplugin {

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& why) {
  throw ProfilesConfigError("device_plugin: " + where + ": " + why);
}

std::uint32_t positive(const YAML::Node& node, const std::string& where, const char* key) {
  try {
    auto value = node.as<std::int64_t>();
    if (value < 1 || value > 100000) refuse(where, std::string(key) + " must be 1 or more");
    return static_cast<std::uint32_t>(value);
  } catch (const YAML::Exception&) {
    refuse(where, std::string(key) + " must be a number");
  }
}

SlotProfile parseProfile(const YAML::Node& node, std::size_t index) {
  std::string where = "profiles[" + std::to_string(index) + "]";
  if (!node.IsMap()) refuse(where, "expected a map with `resource`");
  static const std::set<std::string> kKeys{"resource", "slots_per_gpu", "memory_limit", "weight",
                                           "class"};
  for (const auto& entry : node) {
    auto key = entry.first.as<std::string>();
    if (kKeys.count(key) == 0) refuse(where, "unknown key `" + key + "`");
  }
  SlotProfile profile;
  if (!node["resource"]) refuse(where, "`resource` is missing");
  profile.resourceName = node["resource"].as<std::string>();
  where = profile.resourceName;
  if (node["slots_per_gpu"])
    profile.slotsPerGpu = positive(node["slots_per_gpu"], where, "slots_per_gpu");
  if (node["weight"]) profile.weightPerSlot = positive(node["weight"], where, "weight");
  if (node["memory_limit"]) {
    auto text = node["memory_limit"].as<std::string>();
    auto bytes = protocol::parseByteSize(text);
    if (!bytes) refuse(where, "memory_limit '" + text + "' is not a size (try 4GiB)");
    profile.memoryPerSlot = *bytes;
  }
  if (node["class"]) {
    auto value = node["class"].as<std::string>();
    if (value != "best-effort" && value != "latency-critical") {
      refuse(where, "class must be best-effort or latency-critical, not '" + value + "'");
    }
    profile.latencyCritical = value == "latency-critical";
  }
  if (auto error = profileError(profile); !error.empty()) refuse(where, error);
  return profile;
}

}  // namespace

std::vector<SlotProfile> parseProfilesConfig(const std::string& yaml,
                                             std::uint32_t defaultSlotsPerGpu) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& error) {
    throw ProfilesConfigError("not valid YAML: " + std::string(error.what()));
  }
  SlotProfile defaultProfile;
  defaultProfile.slotsPerGpu = defaultSlotsPerGpu;
  std::vector<SlotProfile> profiles{defaultProfile};
  const YAML::Node section = root.IsMap() ? root["device_plugin"] : YAML::Node();
  if (!section || section.IsNull()) return profiles;
  if (!section.IsMap()) refuse("the section", "expected a map");
  for (const auto& entry : section) {
    auto key = entry.first.as<std::string>();
    if (key != "slots_per_gpu" && key != "profiles")
      refuse("the section", "unknown key `" + key + "`");
  }
  if (section["slots_per_gpu"]) {
    profiles[0].slotsPerGpu = positive(section["slots_per_gpu"], "slots_per_gpu", "slots_per_gpu");
    if (auto error = profileError(profiles[0]); !error.empty()) refuse("slots_per_gpu", error);
  }
  const YAML::Node list = section["profiles"];
  if (list && !list.IsNull()) {
    if (!list.IsSequence()) refuse("profiles", "expected a list");
    std::set<std::string> names{profiles[0].resourceName};
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto profile = parseProfile(list[i], i);
      if (!names.insert(profile.resourceName).second) {
        refuse(profile.resourceName, "the resource is given twice (" +
                                         std::string(kDefaultResourceName) +
                                         " is the default profile: set its slots_per_gpu above)");
      }
      profiles.push_back(std::move(profile));
    }
  }
  return profiles;
}

}  // namespace gpuproxy::deviceplugin
