#pragma once
// Hands out ranges of the data plane's staging area (the shared buffer pageable copies pass
// through) as a ring: ranges are taken at the tail and space comes back at the head. A range is
// given back either by the daemon (StagingRelease, once it has copied an H2D chunk out) or by the
// stub itself (a D2H chunk, once its bytes were copied to the application's buffer). Several
// application threads copy at once, so ranges may be given back out of order; the head then
// waits for the oldest one. Not thread-safe: the data plane calls it under its own lock.
// Header-only and free of stub state so that unit tests can exercise it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace gpuproxy::stub {

class StagingAllocator {
public:
  // Ranges start on this boundary (records and memcpy like aligned offsets).
  static constexpr std::uint64_t kAlignment = 64;

  struct Range {
    std::uint64_t offset = 0;  // in the staging area
    std::uint64_t bytes = 0;
    std::uint64_t ticket = 0;  // identifies the range for released(); increases with each range
  };

  explicit StagingAllocator(std::uint64_t capacity) : capacity_(capacity) {}

  std::uint64_t capacity() const { return capacity_; }
  // Bytes not available to allocate() now (taken, skipped at the end, or waiting on the head).
  std::uint64_t used() const { return tail_ - head_; }

  // A contiguous range of `bytes` (1 ≤ bytes ≤ capacity), or nullopt when it does not fit now.
  // A range never wraps: when it does not fit before the end of the area, the rest of the area is
  // skipped and the range starts at offset 0.
  std::optional<Range> allocate(std::uint64_t bytes) {
    if (bytes == 0 || bytes > capacity_) return std::nullopt;
    const std::uint64_t span = roundUp(bytes);
    const std::uint64_t offset = tail_ % capacity_;
    const std::uint64_t skip = offset + span > capacity_ ? capacity_ - offset : 0;
    if (span > capacity_ || capacity_ - used() < skip + span) return std::nullopt;
    Entry entry{tail_, tail_ + skip + span, skip != 0 ? 0 : offset, bytes, false};
    tail_ = entry.end;
    entries_.push_back(entry);
    return Range{entry.offset, entry.bytes, entry.start};
  }

  // Gives back the range at `offset` of `bytes` (the oldest such range still taken). False when
  // no range matches (a peer that releases what it was never given).
  bool release(std::uint64_t offset, std::uint64_t bytes) {
    for (Entry& entry : entries_) {
      if (!entry.released && entry.offset == offset && entry.bytes == bytes) {
        entry.released = true;
        advanceHead();
        return true;
      }
    }
    return false;
  }

  bool release(const Range& range) { return release(range.offset, range.bytes); }

  // Whether the range with this ticket has been given back.
  bool released(std::uint64_t ticket) const {
    if (ticket < head_) return true;
    for (const Entry& entry : entries_) {
      if (entry.start == ticket) return entry.released;
      if (entry.start > ticket) break;
    }
    return true;
  }

  // The largest range allocate() can ever return at once when the area is otherwise idle.
  std::uint64_t largest() const { return capacity_ / kAlignment * kAlignment; }

private:
  struct Entry {
    std::uint64_t start;  // ring position (monotonic) where its span, skip included, starts
    std::uint64_t end;
    std::uint64_t offset;
    std::uint64_t bytes;
    bool released;
  };

  static std::uint64_t roundUp(std::uint64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  void advanceHead() {
    while (!entries_.empty() && entries_.front().released) {
      head_ = entries_.front().end;
      entries_.pop_front();
    }
    // An idle area starts over at 0, so that a copy as large as the area fits again.
    if (entries_.empty()) head_ = tail_ = roundUpToCapacity(tail_);
  }

  std::uint64_t roundUpToCapacity(std::uint64_t position) const {
    return (position + capacity_ - 1) / capacity_ * capacity_;
  }

  std::uint64_t capacity_;
  std::uint64_t head_ = 0;  // ring positions: everything in [head_, tail_) is not free
  std::uint64_t tail_ = 0;
  std::deque<Entry> entries_;  // in ring order
};

}  // namespace gpuproxy::stub
