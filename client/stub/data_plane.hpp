#pragma once
// The client's end of the shared-memory data plane (docs/architecture.md §3-4,
// protocol/RING_FORMAT.md).
//
// A command ring per device the process can see: each record goes into the ring of its context's
// device (noteContext), so that each GPU reads only its own records. Every application thread
// writes under submitMutex_, held only to encode and publish one record, so each ring's order is
// the order in which the calls happened (a thread that records an event and then hands a lock to
// another thread has published the record before that thread publishes its wait). Each record's
// `sequence` is a counter bumped under the same lock. Records for different devices are ordered
// only where CUDA orders them: a stream waiting for another device's event is two records, one
// per ring (HoldForEvent, LetGoAfterEvent), which the daemon joins.
//
// A completion ring per command ring, all drained by whichever thread needs something from them,
// under completionMutex_: results of Synchronize records and staged D2H chunks (by token), errors
// of asynchronous records (kept in AsyncErrors until the call that CUDA reports them at), and
// staging ranges the daemon is done with (from any ring). A thread that needs something not
// there yet waits on the control block's futex word, to which the daemon adds after every
// completion record of any ring; each wait is bounded so that a dead daemon turns into
// CUDA_ERROR_MPS_CONNECTION_FAILED, not a hang.

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/stub/async_errors.hpp"
#include "client/stub/pinned_heap.hpp"
#include "client/stub/staging_allocator.hpp"
#include "ipc/doorbell.hpp"
#include "ipc/shared_segment.hpp"
#include "ipc/spsc_ring.hpp"
#include "ipc/unique_fd.hpp"
#include "protocol/ring_format.hpp"

namespace gpuproxy::stub {

class DataPlane {
public:
  // Attaches to a segment the daemon sent. Throws std::runtime_error (with the reason) when the
  // segment or its rings do not follow the format. `lost` is the runtime's connection flag: every
  // wait gives up with CUDA_ERROR_MPS_CONNECTION_FAILED once it is set.
  // `doorbells`: one per command ring, in ring order.
  DataPlane(ipc::SharedSegment segment, std::vector<ipc::UniqueFd> doorbells,
            const std::atomic<bool>& lost);
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Writes one record for `context`: `encode(sequence, out)` writes it at the start of `out` (at
  // least `maxBytes` long) and returns its length (0: it could not, nothing is published). Waits
  // while the ring is full. CUDA_ERROR_INVALID_VALUE when the record can never fit in this ring;
  // CUDA_ERROR_MPS_CONNECTION_FAILED when the daemon is gone or broke the ring. A context that a
  // kernel fault made unusable fails every record with that fault, as the driver does.
  template <typename Encode>
  CUresult submit(std::uint64_t context, std::size_t maxBytes, Encode&& encode) {
    if (CUresult sticky = stickyError(context); sticky != CUDA_SUCCESS) return sticky;
    if (maxBytes > maxRecordBytes_) return CUDA_ERROR_INVALID_VALUE;
    for (std::uint32_t attempt = 0;; ++attempt) {
      {
        std::lock_guard lock(submitMutex_);
        if (broken_.load(std::memory_order_relaxed)) return CUDA_ERROR_MPS_CONNECTION_FAILED;
        CommandRing& ring = commandRingLocked(context);
        ipc::RingWriter::Reservation reservation = ring.writer->reserve(maxBytes);
        if (reservation.status == ipc::RingStatus::kOk) {
          const std::size_t used = encode(nextSequence_, reservation.bytes);
          // Nothing was published; the next reserve replaces this one.
          if (used == 0 || used > maxBytes) return CUDA_ERROR_INVALID_VALUE;
          ring.writer->commit(used);
          ++nextSequence_;
          ring.ringer->ring();
          return CUDA_SUCCESS;
        }
        if (reservation.status != ipc::RingStatus::kFull) {
          markBroken(ipc::toString(reservation.status));
          return CUDA_ERROR_MPS_CONNECTION_FAILED;
        }
      }
      // Full: the daemon is behind. Let it catch up without holding the lock, so that threads
      // waiting for completions are not held up by this one.
      if (!waitForRingSpace(attempt)) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
  }

  // submit() for one command of protocol::ring (sequence set here, in ring order).
  template <typename Command>
  CUresult submitCommand(Command& command) {
    return submit(command.context, protocol::ring::encodedSize(command),
                  [&](std::uint64_t sequence, std::span<std::byte> out) {
                    command.sequence = sequence;
                    return protocol::ring::encode(command, out);
                  });
  }

  // `context` is on the process's device `ordinal`: its records go into that device's ring.
  // Before any record of it; a context the plane does not know writes into ring 0 (the daemon
  // answers its records as those of an unknown context).
  void noteContext(std::uint64_t context, std::uint32_t ordinal);
  // The context itself is destroyed.
  void forgetContextRing(std::uint64_t context);

  // Whether a record of `bytes` can ever fit in the command rings.
  bool fits(std::size_t bytes) const { return bytes <= maxRecordBytes_; }

  // A fresh completion token (never 0).
  std::uint64_t newToken() noexcept { return nextToken_.fetch_add(1, std::memory_order_relaxed); }

  // Waits for the Completion of `token` and returns its result.
  CUresult waitFor(std::uint64_t token);
  // Waits a while (at most one bounded wait) for the Completion of any of `tokens`: that token
  // and its result; nullopt if none came; token 0 with CUDA_ERROR_MPS_CONNECTION_FAILED once
  // gpuproxyd is gone.
  std::optional<std::pair<std::uint64_t, CUresult>> waitForAny(
      std::span<const std::uint64_t> tokens);

  // cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize and (with `query`) cuStreamQuery,
  // cuEventQuery: a Synchronize record, then its answer. An asynchronous error of the stream (or
  // event's stream, or context) it synchronises with (the daemon reports those before the answer)
  // is returned instead, and cleared unless sticky.
  CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                       std::uint64_t handle, bool query);

  // For a call that synchronises with all of `context` (a blocking copy): the earliest
  // asynchronous error reported for it, cleared unless sticky; CUDA_SUCCESS when there is none.
  // Drains the completion ring first.
  CUresult takeAsyncError(std::uint64_t context);
  // Whether a DeviceOutput record arrived since the last call (the daemon holds device printf
  // output for this process).
  bool takeDeviceOutputPending() { return deviceOutputPending_.exchange(false); }
  // The sticky error that made `context` unusable, if the stub has heard of one; CUDA_SUCCESS
  // otherwise. Costs one load of shared memory unless the daemon published something new.
  CUresult stickyError(std::uint64_t context) {
    if (completionWordValue() == drainedWord_.load(std::memory_order_relaxed) &&
        !anySticky_.load(std::memory_order_relaxed)) {
      return CUDA_SUCCESS;
    }
    return stickyErrorSlow(context);
  }
  // Forgets what was latched for a context whose resources are gone (destroyed, or a primary
  // context reset).
  void forgetContext(std::uint64_t context);
  // `event` was recorded on `stream` (0: the legacy NULL stream): synchronising with the event
  // reports that stream's errors. forgetEvent when the event is destroyed.
  void noteEventRecorded(std::uint64_t event, std::uint64_t stream);
  void forgetEvent(std::uint64_t event);

  // ---- staging (pageable copies) -------------------------------------------------------------

  std::span<std::byte> staging() const { return staging_; }
  // The size of one pipelined chunk of a staged copy.
  std::uint64_t chunkBytes() const { return chunkBytes_; }
  // A staging range of `bytes` (≤ chunkBytes()), waiting for space; nullopt when the daemon is
  // gone. `progress` runs whenever this has to wait without holding the lock (a D2H copy uses it
  // to finish its own oldest chunk, which frees space); it returns false when it made none.
  std::optional<StagingAllocator::Range> allocateStaging(std::uint64_t bytes,
                                                         const std::function<bool()>& progress);
  // A D2H chunk's range, once its bytes are out.
  void releaseStaging(const StagingAllocator::Range& range);

  // ---- pinned host memory ----------------------------------------------------------------------

  // The segment's pinned heap (protocol/RING_FORMAT.md): mapped at the same address in the
  // daemon, so its pointers are the application's pinned buffers. Not usable() when the daemon
  // granted none.
  PinnedHeap& pinnedHeap() { return *pinnedHeap_; }

  // Times a record had to wait for room in the command ring (the daemon fell behind).
  std::uint64_t ringFullWaits() const { return ringFullWaits_.load(std::memory_order_relaxed); }

private:
  struct CommandRing {
    std::unique_ptr<ipc::RingWriter> writer;
    std::unique_ptr<ipc::DoorbellRinger> ringer;
  };
  // Under submitMutex_: the ring `context`'s records go into.
  CommandRing& commandRingLocked(std::uint64_t context) {
    auto found = contextRings_.find(context);
    return commandRings_[found != contextRings_.end() ? found->second : 0];
  }
  // Drains completions and pauses, longer the more `attempt`s have found the ring full (the
  // daemon leaves commands in the ring while the client has too much work queued, which lasts as
  // long as that work runs); false when the connection is gone.
  bool waitForRingSpace(std::uint32_t attempt);
  // Under completionMutex_: reads every completion record published so far, in every ring.
  void drainLocked();
  // One ring of it; false once the ring is broken.
  bool drainLocked(ipc::RingReader& reader);
  // Blocks until the completion word moves past `seen` or a bounded time passes. False when the
  // connection is gone.
  bool waitForProgress(std::uint32_t seen, std::chrono::milliseconds slice);
  std::uint32_t completionWordValue() const {
    return std::atomic_ref<std::uint32_t>(word_->value).load(std::memory_order_acquire);
  }
  CUresult stickyErrorSlow(std::uint64_t context);
  // Under completionMutex_: the error a synchronisation of `kind`/`handle` reports.
  CUresult takeErrorLocked(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                           std::uint64_t handle);
  void markBroken(const char* why);

  ipc::SharedSegment segment_;
  std::vector<ipc::UniqueFd> doorbells_;
  const std::atomic<bool>& lost_;
  protocol::ring::SegmentLimits limits_;
  std::size_t maxRecordBytes_ = 0;
  std::span<std::byte> staging_;
  std::uint64_t chunkBytes_ = 0;
  ipc::CompletionWord* word_ = nullptr;
  std::atomic<bool> broken_{false};

  std::mutex submitMutex_;
  std::vector<CommandRing> commandRings_;                          // by device ordinal
  std::unordered_map<std::uint64_t, std::uint32_t> contextRings_;  // context -> its ring
  std::uint64_t nextSequence_ = 1;
  std::atomic<std::uint64_t> ringFullWaits_{0};

  std::atomic<std::uint64_t> nextToken_{1};

  std::mutex completionMutex_;
  std::vector<std::unique_ptr<ipc::RingReader>> completionRings_;  // as commandRings_
  std::vector<std::byte> record_;
  std::unordered_map<std::uint64_t, CUresult> results_;  // token -> result
  AsyncErrors asyncErrors_;
  std::unordered_map<std::uint64_t, std::uint64_t> eventStreams_;  // event -> stream last recorded
  // The completion word's value when the ring was last drained, and whether any context has a
  // sticky error: what makes stickyError() cheap. Written under completionMutex_.
  std::atomic<std::uint32_t> drainedWord_{0};
  std::atomic<bool> anySticky_{false};
  std::atomic<bool> deviceOutputPending_{false};
  StagingAllocator stagingAllocator_;
  std::unique_ptr<PinnedHeap> pinnedHeap_;
};

}  // namespace gpuproxy::stub
