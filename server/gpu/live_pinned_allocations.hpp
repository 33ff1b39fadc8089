#pragma once
// A client's live pinned allocations in its data-plane segment's pinned heap, as the daemon keeps
// them (never as the client's allocator does: that bookkeeping lives in memory the client can
// scribble over). The session writes it as registrations begin and end; whoever executes the
// client's command records reads it, to refuse a host range outside them. Readers need not be on
// the session's thread: a GPU served by a thread of its own checks its records against the same
// table, which is why it is behind a lock (held only for one lookup) and shared by pointer.

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>

namespace gpuproxy::server {

// Whether [start, start + bytes) overlaps a range of `ranges` (start -> its bytes, or -> an entry
// with its `bytes`). The ranges do not overlap one another.
template <typename Entry>
bool overlapsAnyRange(const std::map<std::uint64_t, Entry>& ranges, std::uint64_t start,
                      std::uint64_t bytes) {
  auto lengthOf = [](const Entry& entry) -> std::uint64_t {
    if constexpr (std::is_integral_v<Entry>) {
      return entry;
    } else {
      return entry.bytes;
    }
  };
  auto next = ranges.lower_bound(start);
  if (next != ranges.end() && next->first < start + bytes) return true;
  if (next == ranges.begin()) return false;
  auto previous = std::prev(next);
  return previous->first + lengthOf(previous->second) > start;
}

class LivePinnedAllocations {
public:
  using Ranges = std::map<std::uint64_t, std::uint64_t>;  // offset -> bytes

  // Whether [offset, offset + bytes) lies inside one live allocation. Two adjacent allocations do
  // not make one: the client's allocator may hand them to unrelated owners.
  bool holds(std::uint64_t offset, std::uint64_t bytes) const;
  // Whether [offset, offset + bytes) overlaps a live allocation.
  bool overlaps(std::uint64_t offset, std::uint64_t bytes) const;

  // Makes [offset, offset + bytes) live. The caller has checked that it overlaps nothing.
  void add(std::uint64_t offset, std::uint64_t bytes);
  // Ends the allocation that starts at `offset`: its bytes, or nullopt if none starts there.
  std::optional<std::uint64_t> remove(std::uint64_t offset);
  // Ends every allocation (the session's teardown): what was live.
  Ranges removeAll();

private:
  mutable std::mutex mutex_;
  Ranges ranges_;
};

}  // namespace gpuproxy::server
