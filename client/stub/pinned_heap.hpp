#pragma once
// The pinned host heap: the data-plane segment's pinnedHeap region, mapped at the same address in
// the daemon, carved into page-aligned allocations for cuMemAllocHost / cuMemHostAlloc. The
// allocator (Boost.Interprocess's best-fit, over the region as an external buffer) keeps its
// bookkeeping inside the region, which only this process reads: the daemon keeps its own table
// of the ranges registered with it. Which pointers are allocations, and how long, is kept here
// outside the shared memory, so copies can tell in O(log n) whether a host range is pinned.
// Thread-safe. Header-only and free of stub state so that unit tests can exercise it.

#include <boost/interprocess/indexes/iset_index.hpp>
#include <boost/interprocess/managed_external_buffer.hpp>
#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <span>

namespace gpuproxy::stub {

class PinnedHeap {
public:
  static constexpr std::uint64_t kPage = 4096;

  struct Allocation {
    std::uint64_t offset = 0;  // from the start of the region
    std::uint64_t bytes = 0;   // a multiple of kPage: what the daemon registers
  };

  // `region` must be page-aligned; an empty one (or one too small for the allocator's own
  // header) gives a heap that allocates nothing.
  explicit PinnedHeap(std::span<std::byte> region) : region_(region) {
    if (region.size() < 4 * kPage) return;
    try {
      buffer_.emplace(boost::interprocess::create_only, region.data(), region.size());
    } catch (const std::exception&) {
      buffer_.reset();
    }
  }
  PinnedHeap(const PinnedHeap&) = delete;
  PinnedHeap& operator=(const PinnedHeap&) = delete;

  bool usable() const { return buffer_.has_value(); }
  std::span<std::byte> region() const { return region_; }

  // `bytes` (> 0) rounded up to whole pages, starting on a page; nullopt when there is no room.
  std::optional<Allocation> allocate(std::uint64_t bytes) {
    if (!buffer_ || bytes == 0 || bytes > region_.size()) return std::nullopt;
    const std::uint64_t length = (bytes + kPage - 1) / kPage * kPage;
    std::lock_guard lock(mutex_);
    void* memory = buffer_->get_segment_manager()->allocate_aligned(
        static_cast<std::size_t>(length), static_cast<std::size_t>(kPage), std::nothrow);
    if (memory == nullptr) return std::nullopt;
    const auto offset =
        static_cast<std::uint64_t>(static_cast<std::byte*>(memory) - region_.data());
    allocations_.emplace(offset, length);
    inUse_ += length;
    return Allocation{offset, length};
  }

  // The allocation that starts at `pointer`, if there is one.
  std::optional<Allocation> lookup(const void* pointer) const {
    std::lock_guard lock(mutex_);
    const auto offset = offsetOf(pointer);
    if (!offset) return std::nullopt;
    auto found = allocations_.find(*offset);
    if (found == allocations_.end()) return std::nullopt;
    return Allocation{found->first, found->second};
  }

  // Gives back the allocation starting at `offset`; false when there is none.
  bool free(std::uint64_t offset) {
    std::lock_guard lock(mutex_);
    auto found = allocations_.find(offset);
    if (found == allocations_.end()) return false;
    inUse_ -= found->second;
    allocations_.erase(found);
    buffer_->get_segment_manager()->deallocate(region_.data() + offset);
    return true;
  }

  // The offset of host range [pointer, pointer + bytes) in the region when it lies inside one
  // allocation; nullopt otherwise (including any range that leaves the heap).
  std::optional<std::uint64_t> offsetInAllocation(const void* pointer, std::uint64_t bytes) const {
    std::lock_guard lock(mutex_);
    const auto offset = offsetOf(pointer);
    if (!offset) return std::nullopt;
    auto holder = allocations_.upper_bound(*offset);
    if (holder == allocations_.begin()) return std::nullopt;
    holder = std::prev(holder);
    const std::uint64_t inside = *offset - holder->first;
    if (inside >= holder->second || bytes > holder->second - inside) return std::nullopt;
    return *offset;
  }

  std::uint64_t bytesInUse() const {
    std::lock_guard lock(mutex_);
    return inUse_;
  }

private:
  using Buffer = boost::interprocess::basic_managed_external_buffer<
      char, boost::interprocess::rbtree_best_fit<boost::interprocess::null_mutex_family>,
      boost::interprocess::iset_index>;

  std::optional<std::uint64_t> offsetOf(const void* pointer) const {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    const auto base = reinterpret_cast<std::uintptr_t>(region_.data());
    if (region_.empty() || address < base || address - base >= region_.size()) {
      return std::nullopt;
    }
    return address - base;
  }

  const std::span<std::byte> region_;
  mutable std::mutex mutex_;
  std::optional<Buffer> buffer_;
  std::map<std::uint64_t, std::uint64_t> allocations_;  // offset -> bytes
  std::uint64_t inUse_ = 0;
};

}  // namespace gpuproxy::stub
