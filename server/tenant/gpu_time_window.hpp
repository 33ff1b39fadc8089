#pragma once
// GPU time a tenant received over the last ten seconds, in 1-second buckets, for the share that
// `gpuproxyctl status` shows next to the tenant's weight. Fed with measured kernel times as
// kernels complete. Not thread-safe: Tenant guards its own.

#include <array>
#include <cstdint>
#include <limits>

namespace gpuproxy::server {

class GpuTimeWindow {
public:
  static constexpr int kSeconds = 10;

  // `now` and the bucket boundaries are nanoseconds on one monotonic clock.
  void add(std::int64_t now, std::uint64_t gpuNanoseconds) {
    const std::int64_t second = now / kNanosPerSecond;
    Bucket& bucket = buckets_[static_cast<std::size_t>(second % kSeconds)];
    if (bucket.second != second) bucket = Bucket{second, 0};
    bucket.nanoseconds += gpuNanoseconds;
  }

  // GPU time in the current second and the nine before it.
  std::uint64_t total(std::int64_t now) const {
    const std::int64_t second = now / kNanosPerSecond;
    std::uint64_t sum = 0;
    for (const Bucket& bucket : buckets_) {
      if (bucket.second <= second && bucket.second > second - kSeconds) sum += bucket.nanoseconds;
    }
    return sum;
  }

private:
  static constexpr std::int64_t kNanosPerSecond = 1'000'000'000;
  struct Bucket {
    std::int64_t second = std::numeric_limits<std::int64_t>::min();
    std::uint64_t nanoseconds = 0;
  };
  std::array<Bucket, kSeconds> buckets_{};
};

}  // namespace gpuproxy::server
