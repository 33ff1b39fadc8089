#pragma once
// The client's end of the shared-memory data plane (DESIGN §2, protocol/RING_FORMAT.md).
//
// One command ring for the whole process: every application thread writes its records under
// submitMutex_, held only to encode and publish one record, so the ring's order is the order in
// which the calls happened (a thread that records an event and then hands a lock to another
// thread has published the record before that thread publishes its wait). Each record's
// `sequence` is a counter bumped under the same lock.
//
// One completion ring, drained by whichever thread needs something from it, under
// completionMutex_: results of Synchronize records and staged D2H chunks (by token), errors of
// asynchronous records (latched per context until the next call that synchronises with it), and
// staging ranges the daemon is done with. A thread that needs something not there yet waits on
// the control block's futex word, which the daemon bumps after every completion record; each
// wait is bounded so that a dead daemon turns into CUDA_ERROR_MPS_CONNECTION_FAILED, not a hang.

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
#include <vector>

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
  DataPlane(ipc::SharedSegment segment, ipc::UniqueFd doorbell, const std::atomic<bool>& lost);
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Writes one record: `encode(sequence, out)` writes it at the start of `out` (at least
  // `maxBytes` long) and returns its length (0: it could not, nothing is published). Waits while
  // the ring is full. CUDA_ERROR_INVALID_VALUE when the record can never fit in this ring;
  // CUDA_ERROR_MPS_CONNECTION_FAILED when the daemon is gone or broke the ring.
  template <typename Encode>
  CUresult submit(std::size_t maxBytes, Encode&& encode) {
    if (maxBytes > maxRecordBytes_) return CUDA_ERROR_INVALID_VALUE;
    for (std::uint32_t attempt = 0;; ++attempt) {
      {
        std::lock_guard lock(submitMutex_);
        if (broken_.load(std::memory_order_relaxed)) return CUDA_ERROR_MPS_CONNECTION_FAILED;
        ipc::RingWriter::Reservation reservation = writer_->reserve(maxBytes);
        if (reservation.status == ipc::RingStatus::kOk) {
          const std::size_t used = encode(nextSequence_, reservation.bytes);
          // Nothing was published; the next reserve replaces this one.
          if (used == 0 || used > maxBytes) return CUDA_ERROR_INVALID_VALUE;
          writer_->commit(used);
          ++nextSequence_;
          ringer_->ring();
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
    return submit(protocol::ring::encodedSize(command),
                  [&](std::uint64_t sequence, std::span<std::byte> out) {
                    command.sequence = sequence;
                    return protocol::ring::encode(command, out);
                  });
  }

  // Whether a record of `bytes` can ever fit in the command ring.
  bool fits(std::size_t bytes) const { return bytes <= maxRecordBytes_; }

  // A fresh completion token (never 0).
  std::uint64_t newToken() noexcept { return nextToken_.fetch_add(1, std::memory_order_relaxed); }

  // Waits for the Completion of `token` and returns its result.
  CUresult waitFor(std::uint64_t token);

  // cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize and (with `query`) cuStreamQuery,
  // cuEventQuery: a Synchronize record, then its answer. An asynchronous error latched for
  // `context` (the daemon reports those before the answer) is returned first, and cleared.
  CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                       std::uint64_t handle, bool query);

  // The first asynchronous error reported for `context` since the last call, cleared by this
  // call; CUDA_SUCCESS when there is none. Drains the completion ring first.
  CUresult takeAsyncError(std::uint64_t context);
  // Forgets what was latched for a context that is gone.
  void forgetContext(std::uint64_t context);

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
  // Drains completions and pauses, longer the more `attempt`s have found the ring full (the
  // daemon leaves commands in the ring while the client has too much work queued, which lasts as
  // long as that work runs); false when the connection is gone.
  bool waitForRingSpace(std::uint32_t attempt);
  // Under completionMutex_: reads every completion record published so far.
  void drainLocked();
  // Blocks until the completion word moves past `seen` or a bounded time passes. False when the
  // connection is gone.
  bool waitForProgress(std::uint32_t seen, std::chrono::milliseconds slice);
  std::uint32_t completionWordValue() const;
  void markBroken(const char* why);

  ipc::SharedSegment segment_;
  ipc::UniqueFd doorbell_;
  const std::atomic<bool>& lost_;
  protocol::ring::SegmentLimits limits_;
  std::size_t maxRecordBytes_ = 0;
  std::span<std::byte> staging_;
  std::uint64_t chunkBytes_ = 0;
  ipc::CompletionWord* word_ = nullptr;
  std::atomic<bool> broken_{false};

  std::mutex submitMutex_;
  std::unique_ptr<ipc::RingWriter> writer_;
  std::unique_ptr<ipc::DoorbellRinger> ringer_;
  std::uint64_t nextSequence_ = 1;
  std::atomic<std::uint64_t> ringFullWaits_{0};

  std::atomic<std::uint64_t> nextToken_{1};

  std::mutex completionMutex_;
  std::unique_ptr<ipc::RingReader> reader_;
  std::vector<std::byte> record_;
  std::unordered_map<std::uint64_t, CUresult> results_;        // token -> result
  std::unordered_map<std::uint64_t, CUresult> latchedErrors_;  // context -> first error
  StagingAllocator stagingAllocator_;
  std::unique_ptr<PinnedHeap> pinnedHeap_;
};

}  // namespace gpuproxy::stub
