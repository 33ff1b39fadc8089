#include "client/deviceplugin/slots.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <set>

namespace gpuproxy::deviceplugin {

namespace {

// The daemon's range for a tenant's weight (TenantSpec.weight).
constexpr std::uint64_t kMaxWeight = 10000;

std::optional<std::uint32_t> parseIndex(std::string_view text) {
  if (text.empty() || text.size() > 6 || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  std::uint32_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool isNameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

}  // namespace

std::string slotId(Slot slot) {
  return "gpu" + std::to_string(slot.gpu) + "-slot" + std::to_string(slot.slot);
}

std::optional<Slot> parseSlotId(std::string_view id) {
  constexpr std::string_view kGpu = "gpu";
  constexpr std::string_view kSlot = "-slot";
  if (id.substr(0, kGpu.size()) != kGpu) return std::nullopt;
  auto rest = id.substr(kGpu.size());
  auto separator = rest.find(kSlot);
  if (separator == std::string_view::npos) return std::nullopt;
  auto gpu = parseIndex(rest.substr(0, separator));
  auto slot = parseIndex(rest.substr(separator + kSlot.size()));
  if (!gpu || !slot) return std::nullopt;
  return Slot{*gpu, *slot};
}

std::string profileError(const SlotProfile& profile) {
  const auto& name = profile.resourceName;
  auto slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size() ||
      name.find('/', slash + 1) != std::string::npos) {
    return "resource '" + name + "' is not an extended resource name (domain/name, e.g. " +
           std::string(kDefaultResourceName) + ")";
  }
  auto domain = name.substr(0, slash);
  if (domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")) {
    return "resource '" + name + "': the kubernetes.io domain is reserved";
  }
  auto local = name.substr(slash + 1);
  if (!std::all_of(name.begin(), name.end(),
                   [](char c) { return isNameCharacter(c) || c == '/'; }) ||
      local.size() > 63) {
    return "resource '" + name + "' has characters a resource name cannot have";
  }
  if (profile.slotsPerGpu == 0) return "resource '" + name + "': slots per GPU must be at least 1";
  if (profile.weightPerSlot == 0 ||
      std::uint64_t{profile.weightPerSlot} * profile.slotsPerGpu > kMaxWeight) {
    return "resource '" + name + "': weight per slot times slots per GPU must be 1 to " +
           std::to_string(kMaxWeight);
  }
  if (profile.memoryPerSlot && *profile.memoryPerSlot == 0) {
    return "resource '" + name + "': a slot's memory must be more than 0";
  }
  return {};
}

std::string endpointName(const SlotProfile& profile) {
  auto slash = profile.resourceName.find('/');
  auto local = profile.resourceName.substr(slash == std::string::npos ? 0 : slash + 1);
  return "gpuproxy-" + local + ".sock";
}

std::vector<std::string> advertisedSlots(const SlotProfile& profile, const std::vector<Gpu>& gpus) {
  std::vector<std::string> ids;
  for (const auto& gpu : gpus) {
    for (std::uint32_t slot = 0; slot < profile.slotsPerGpu; ++slot) {
      ids.push_back(slotId({gpu.index, slot}));
    }
  }
  return ids;
}

std::variant<Allocation, std::string> validateAllocation(
    const SlotProfile& profile, const std::vector<Gpu>& gpus,
    const std::vector<std::string>& deviceIds) {
  const auto& resource = profile.resourceName;
  if (deviceIds.empty()) return "the request for " + resource + " names no device";
  if (deviceIds.size() > profile.slotsPerGpu) {
    return "the request asks for " + std::to_string(deviceIds.size()) + " slots of " + resource +
           ", but a GPU has " + std::to_string(profile.slotsPerGpu) +
           " and an allocation gets slots of one GPU only";
  }
  std::set<std::string> seen;
  std::optional<Slot> first;
  for (const auto& id : deviceIds) {
    auto slot = parseSlotId(id);
    if (!slot) return "'" + id + "' is not a device id of " + resource + " (gpu<N>-slot<M>)";
    bool gpuExists = std::any_of(gpus.begin(), gpus.end(),
                                 [&](const Gpu& gpu) { return gpu.index == slot->gpu; });
    if (!gpuExists || slot->slot >= profile.slotsPerGpu) {
      return "'" + id + "' is not a slot of " + resource + " on this node";
    }
    if (!seen.insert(id).second) return "'" + id + "' is asked for twice";
    if (!first) {
      first = slot;
    } else if (first->gpu != slot->gpu) {
      return "the request spans GPUs (" + slotId(*first) + " is on GPU " +
             std::to_string(first->gpu) + ", " + id + " on GPU " + std::to_string(slot->gpu) +
             "): an allocation of " + resource +
             " gets slots of one GPU only; ask for fewer slots per container";
    }
  }
  return Allocation{first->gpu, std::vector<std::string>(seen.begin(), seen.end())};
}

std::vector<std::string> preferredAllocation(const std::vector<std::string>& available,
                                             const std::vector<std::string>& mustInclude,
                                             std::size_t size) {
  std::vector<std::string> chosen(mustInclude.begin(), mustInclude.end());
  std::set<std::string> taken(mustInclude.begin(), mustInclude.end());
  if (chosen.size() >= size) return chosen;

  // Free slots by GPU, in slot order.
  std::map<std::uint32_t, std::vector<std::pair<std::uint32_t, std::string>>> free;
  for (const auto& id : available) {
    auto slot = parseSlotId(id);
    if (slot && taken.count(id) == 0) free[slot->gpu].emplace_back(slot->slot, id);
  }
  for (auto& [gpu, slots] : free) std::sort(slots.begin(), slots.end());

  std::vector<std::uint32_t> order;
  std::optional<std::uint32_t> mustGpu;
  for (const auto& id : mustInclude) {
    if (auto slot = parseSlotId(id)) {
      mustGpu = slot->gpu;
      break;
    }
  }
  if (mustGpu) {
    order.push_back(*mustGpu);
  } else {
    std::optional<std::uint32_t> bestFit;
    for (const auto& [gpu, slots] : free) {
      if (slots.size() >= size && (!bestFit || slots.size() < free[*bestFit].size())) {
        bestFit = gpu;
      }
    }
    if (bestFit) order.push_back(*bestFit);
  }
  // Then the rest, most free slots first, so that a request no GPU holds spans as few as it can.
  std::vector<std::uint32_t> rest;
  for (const auto& [gpu, slots] : free) {
    if (std::find(order.begin(), order.end(), gpu) == order.end()) rest.push_back(gpu);
  }
  std::stable_sort(rest.begin(), rest.end(), [&](std::uint32_t a, std::uint32_t b) {
    return free[a].size() > free[b].size();
  });
  order.insert(order.end(), rest.begin(), rest.end());

  for (auto gpu : order) {
    for (const auto& [slot, id] : free[gpu]) {
      if (chosen.size() >= size) return chosen;
      chosen.push_back(id);
    }
  }
  return chosen;
}

AllocationLimits limitsOf(const SlotProfile& profile, const Gpu& gpu, std::size_t slots) {
  const std::uint64_t perSlot =
      profile.memoryPerSlot ? *profile.memoryPerSlot : gpu.memoryTotal / profile.slotsPerGpu;
  AllocationLimits limits;
  limits.memoryLimit = perSlot * slots;
  limits.weight = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(kMaxWeight, std::uint64_t{profile.weightPerSlot} * slots));
  limits.latencyCritical = profile.latencyCritical;
  return limits;
}

std::string tenantName(std::string_view resourceName, const std::vector<std::string>& sortedIds) {
  // FNV-1a over the resource and the ids: a stable name within the daemon's 64 characters.
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&](std::string_view text) {
    for (unsigned char c : text) {
      hash ^= c;
      hash *= 0x100000001b3ULL;
    }
    hash ^= 0xff;  // a separator no id contains
    hash *= 0x100000001b3ULL;
  };
  mix(resourceName);
  for (const auto& id : sortedIds) mix(id);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return std::string("k8s-") + hex;
}

}  // namespace gpuproxy::deviceplugin
