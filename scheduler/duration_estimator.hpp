#pragma once
// Per-(tenant, function, launch shape) GPU duration estimates, learned from completions. DNN
// workloads launch the same kernels with the same shapes every iteration, so an EWMA per key
// converges within a few iterations; keys never measured get a pessimistic default so unknown
// work is treated as long until it has run once.

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace gpuproxy::scheduler {

using Nanos = std::int64_t;
using TenantId = std::uint32_t;

enum class WorkKind : std::uint8_t { kKernel, kMemcpy, kMemset, kGraph, kOther };

struct DurationKey {
  WorkKind kind = WorkKind::kKernel;
  std::uint64_t function = 0;  // CUfunction or graph handle; 0 for copies and memsets
  std::uint64_t shape = 0;     // launchShape(...) for kernels, a size bucket for copies
  bool operator==(const DurationKey&) const = default;
};

// Folds grid, block and dynamic shared memory into one key: the same kernel with another shape is
// another duration.
std::uint64_t launchShape(std::array<std::uint32_t, 3> grid, std::array<std::uint32_t, 3> block,
                          std::uint32_t sharedBytes);

struct DurationEstimate {
  Nanos value = 0;
  bool measured = false;
};

class DurationEstimator {
public:
  DurationEstimator(Nanos unmeasured, double ewmaWeight);

  DurationEstimate estimate(TenantId tenant, const DurationKey& key) const;
  void record(TenantId tenant, const DurationKey& key, Nanos measured);
  void forgetTenant(TenantId tenant);
  std::size_t size() const { return estimates_.size(); }

private:
  struct Key {
    TenantId tenant;
    DurationKey key;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  struct Entry {
    double ewma = 0;
    std::uint64_t samples = 0;
  };

  Nanos unmeasured_;
  double ewmaWeight_;
  std::unordered_map<Key, Entry, KeyHash> estimates_;
};

}  // namespace gpuproxy::scheduler
