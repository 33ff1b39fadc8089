#include "scheduler/duration_estimator.hpp"

#include <cmath>
#include <functional>

namespace gpuproxy::scheduler {
namespace {

// splitmix64 finaliser: cheap, and mixes well enough that nearby shapes do not collide.
std::uint64_t mix(std::uint64_t seed, std::uint64_t value) {
  std::uint64_t z = seed ^ (value + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t launchShape(std::array<std::uint32_t, 3> grid, std::array<std::uint32_t, 3> block,
                          std::uint32_t sharedBytes) {
  std::uint64_t h = 0;
  for (std::uint32_t v : grid) h = mix(h, v);
  for (std::uint32_t v : block) h = mix(h, v);
  return mix(h, sharedBytes);
}

std::size_t DurationEstimator::KeyHash::operator()(const Key& key) const {
  std::uint64_t h = mix(key.tenant, static_cast<std::uint64_t>(key.key.kind));
  h = mix(h, key.key.function);
  return static_cast<std::size_t>(mix(h, key.key.shape));
}

DurationEstimator::DurationEstimator(Nanos unmeasured, double ewmaWeight)
    : unmeasured_(unmeasured), ewmaWeight_(ewmaWeight) {}

DurationEstimate DurationEstimator::estimate(TenantId tenant, const DurationKey& key) const {
  auto it = estimates_.find(Key{tenant, key});
  if (it == estimates_.end()) return {unmeasured_, false};
  return {static_cast<Nanos>(std::llround(it->second.ewma)), true};
}

void DurationEstimator::record(TenantId tenant, const DurationKey& key, Nanos measured) {
  if (measured < 0) measured = 0;
  Entry& entry = estimates_[Key{tenant, key}];
  // The first sample replaces the pessimistic default outright: averaging it in would keep a
  // short kernel classified as long for many launches.
  entry.ewma = entry.samples == 0
                   ? static_cast<double>(measured)
                   : entry.ewma + ewmaWeight_ * (static_cast<double>(measured) - entry.ewma);
  ++entry.samples;
}

void DurationEstimator::forgetTenant(TenantId tenant) {
  std::erase_if(estimates_, [tenant](const auto& entry) { return entry.first.tenant == tenant; });
}

}  // namespace gpuproxy::scheduler
