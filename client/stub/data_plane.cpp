#include "client/stub/data_plane.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

#include "client/stub/log.hpp"
#include "protocol/cuda_result.hpp"
#include "protocol/overloaded.hpp"

namespace gpuproxy::stub {

namespace ring = protocol::ring;

// The control block starts with the daemon's completion counter and the waiter count, which is
// exactly the pair ipc::CompletionWaiter blocks on.
static_assert(sizeof(ring::wire::ControlBlock) >= sizeof(ipc::CompletionWord));
static_assert(offsetof(ring::wire::ControlBlock, completionsPublished) ==
              offsetof(ipc::CompletionWord, value));
static_assert(offsetof(ring::wire::ControlBlock, completionWaiters) ==
              offsetof(ipc::CompletionWord, waiters));
static_assert(alignof(ipc::CompletionWord) <= ring::kRegionAlignment);

namespace {

// About 50 µs of polling (yielding the CPU now and then) before a waiter sleeps: long enough for
// a daemon that was asleep to wake up and answer (10-25 µs on the 2-vCPU VMs measured, so the
// answer does not also pay for waking this thread) and for a short kernel or copy; a longer wait
// is not worth burning a core for. Measured in time, not iterations: a pause instruction takes
// from a few to over a hundred cycles by CPU model.
constexpr std::chrono::microseconds kSpin{50};
// Each sleep is bounded so that a daemon that died (its socket closing sets the runtime's flag)
// is noticed; a completion wakes the waiter at once.
constexpr std::chrono::milliseconds kWaitSlice{100};
constexpr std::chrono::milliseconds kStagingWaitSlice{1};
// Pauses between attempts while the command ring is full.
constexpr std::chrono::microseconds kFullRingPause{20};
constexpr std::chrono::microseconds kFullRingPauseMax{1000};
// A staged copy keeps several chunks in flight so that filling one overlaps moving another.
constexpr std::uint64_t kChunksPerStagingArea = 4;
constexpr std::uint64_t kPage = 4096;

std::span<std::byte> regionOf(const ipc::SharedSegment& segment, const ring::wire::Region& region) {
  return {segment.data() + region.offset, static_cast<std::size_t>(region.bytes)};
}

// Ring capacity of a region: what follows the ring's own header.
std::size_t ringCapacity(const char* what, std::uint64_t regionBytes) {
  if (regionBytes <= sizeof(ipc::RingHeader)) {
    throw std::runtime_error(std::string(what) + " region of " + std::to_string(regionBytes) +
                             " bytes holds no ring");
  }
  return ipc::ringCapacityOf(static_cast<std::size_t>(regionBytes));
}

}  // namespace

DataPlane::DataPlane(ipc::SharedSegment segment, std::vector<ipc::UniqueFd> doorbells,
                     const std::atomic<bool>& lost)
    : segment_(std::move(segment)),
      doorbells_(std::move(doorbells)),
      lost_(lost),
      stagingAllocator_(0) {
  auto read = ring::readSegmentHeader(segment_.bytes());
  if (const auto* error = std::get_if<ring::SegmentHeaderError>(&read)) {
    throw std::runtime_error("segment header refused: " + std::string(ring::describe(*error)));
  }
  const ring::wire::SegmentHeader header = std::get<ring::wire::SegmentHeader>(read);
  if (doorbells_.size() != header.commandRingCount) {
    throw std::runtime_error(std::to_string(doorbells_.size()) + " doorbells for " +
                             std::to_string(header.commandRingCount) + " command rings");
  }
  for (std::uint32_t i = 0; i < header.commandRingCount; ++i) {
    const ring::wire::Region commands = ring::commandRing(header, i);
    const ring::wire::Region completions = ring::completionRing(header, i);
    CommandRing& added = commandRings_.emplace_back();
    added.writer = std::make_unique<ipc::RingWriter>(regionOf(segment_, commands),
                                                     ringCapacity("command ring", commands.bytes));
    added.ringer = std::make_unique<ipc::DoorbellRinger>(added.writer->consumerSleeping(),
                                                         doorbells_[i].get());
    completionRings_.push_back(std::make_unique<ipc::RingReader>(
        regionOf(segment_, completions), ringCapacity("completion ring", completions.bytes)));
    const std::size_t fits = added.writer->maxRecordBytes();
    maxRecordBytes_ = i == 0 ? fits : std::min(maxRecordBytes_, fits);
  }
  if (header.control.bytes < sizeof(ring::wire::ControlBlock)) {
    throw std::runtime_error("control region of " + std::to_string(header.control.bytes) +
                             " bytes has no control block");
  }
  word_ = reinterpret_cast<ipc::CompletionWord*>(segment_.data() + header.control.offset);
  staging_ = regionOf(segment_, header.staging);
  limits_ = ring::limitsOf(header);
  stagingAllocator_ = StagingAllocator(header.staging.bytes);
  if (header.staging.bytes >= kPage) {
    chunkBytes_ = std::max(kPage, header.staging.bytes / kChunksPerStagingArea / kPage * kPage);
    chunkBytes_ = std::min(chunkBytes_, stagingAllocator_.largest());
  }
  pinnedHeap_ = std::make_unique<PinnedHeap>(regionOf(segment_, header.pinnedHeap));
  record_.reserve(ring::kMaxCompletionRecordBytes);
  GPUPROXY_STUB_LOG(
      kInfo,
      "data plane: %u ring pairs of a %zu-byte command ring and a %zu-byte completion ring, %llu "
      "bytes of staging, %llu bytes of pinned heap at %p",
      header.commandRingCount, commandRings_.front().writer->capacity(),
      completionRings_.front()->capacity(), static_cast<unsigned long long>(header.staging.bytes),
      static_cast<unsigned long long>(pinnedHeap_->usable() ? header.pinnedHeap.bytes : 0),
      static_cast<void*>(segment_.data() + header.pinnedHeap.offset));
}

DataPlane::~DataPlane() = default;

void DataPlane::markBroken(const char* why) {
  if (broken_.exchange(true)) return;
  GPUPROXY_STUB_LOG(kError,
                    "data plane: %s; asynchronous calls now fail with "
                    "CUDA_ERROR_MPS_CONNECTION_FAILED",
                    why);
}

void DataPlane::drainLocked() {
  // Read before the records: a completion published meanwhile moves the word past this value.
  drainedWord_.store(completionWordValue(), std::memory_order_relaxed);
  for (const std::unique_ptr<ipc::RingReader>& reader : completionRings_) {
    if (!drainLocked(*reader)) return;
  }
}

bool DataPlane::drainLocked(ipc::RingReader& reader) {
  for (;;) {
    const ipc::RingStatus status = reader.read(record_);
    if (status == ipc::RingStatus::kEmpty) return true;
    if (status != ipc::RingStatus::kOk) {
      markBroken("gpuproxyd broke the completion ring's format");
      return false;
    }
    const ring::DecodedCompletion decoded = ring::decodeCompletion(record_, limits_);
    std::visit(protocol::Overloaded{
                   [&](const ring::Completion& completion) {
                     results_[completion.token] = completion.result;
                   },
                   [&](const ring::AsyncError& error) {
                     GPUPROXY_STUB_LOG(
                         kInfo,
                         "asynchronous command %llu (opcode %u) on stream %#llx failed: %s; "
                         "reported at the next synchronising call",
                         static_cast<unsigned long long>(error.sequence),
                         static_cast<unsigned>(error.opcode),
                         static_cast<unsigned long long>(error.stream),
                         std::string(protocol::cudaResultNameOr(error.result, "unknown CUresult"))
                             .c_str());
                     asyncErrors_.record(error);
                     anySticky_.store(asyncErrors_.anySticky(), std::memory_order_relaxed);
                   },
                   [&](const ring::StagingRelease& release) {
                     if (!stagingAllocator_.release(release.offset, release.bytes)) {
                       GPUPROXY_STUB_LOG(kError,
                                         "data plane: gpuproxyd released staging bytes "
                                         "[%llu, +%llu) that were not in use",
                                         static_cast<unsigned long long>(release.offset),
                                         static_cast<unsigned long long>(release.bytes));
                     }
                   },
                   [&](const ring::DeviceOutput&) {
                     deviceOutputPending_.store(true, std::memory_order_relaxed);
                   },
                   [&](const ring::DecodeError& error) {
                     GPUPROXY_STUB_LOG(kError, "data plane: undecodable completion record: %s",
                                       std::string(ring::describe(error.failure)).c_str());
                     markBroken("gpuproxyd sent a completion record this stub cannot read");
                   },
               },
               decoded);
  }
}

bool DataPlane::waitForProgress(std::uint32_t seen, std::chrono::milliseconds slice) {
  if (lost_.load(std::memory_order_acquire) || broken_.load(std::memory_order_acquire)) {
    return false;
  }
  ipc::CompletionWaiter waiter(*word_);
  const auto spinUntil = std::chrono::steady_clock::now() + kSpin;
  for (std::uint32_t i = 1;; ++i) {
    if (waiter.load() != seen) return true;
    ipc::cpuRelax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= spinUntil) break;
      // The daemon, woken by our doorbell, may have been put on this CPU.
      ipc::yieldCpu();
    }
  }
  waiter.wait([seen](std::uint32_t value) { return value != seen; }, 0, slice);
  return !lost_.load(std::memory_order_acquire) && !broken_.load(std::memory_order_acquire);
}

bool DataPlane::waitForRingSpace(std::uint32_t attempt) {
  if (attempt == 0) ringFullWaits_.fetch_add(1, std::memory_order_relaxed);
  {
    // The daemon may be waiting for room in the completion ring before it moves on.
    std::lock_guard lock(completionMutex_);
    drainLocked();
  }
  if (lost_.load(std::memory_order_acquire) || broken_.load(std::memory_order_acquire)) {
    return false;
  }
  // Nothing announces that the daemon has read commands, so this polls: every 20 µs at first,
  // backing off to every millisecond.
  const auto pause = attempt < 6 ? kFullRingPause * (1u << attempt) : kFullRingPauseMax;
  std::this_thread::sleep_for(std::min(pause, kFullRingPauseMax));
  return true;
}

CUresult DataPlane::waitFor(std::uint64_t token) {
  for (;;) {
    std::uint32_t seen = 0;
    {
      std::lock_guard lock(completionMutex_);
      // Read before draining: a completion published after the drain moves the word past `seen`.
      seen = completionWordValue();
      drainLocked();
      if (auto found = results_.find(token); found != results_.end()) {
        const CUresult result = found->second;
        results_.erase(found);
        return result;
      }
    }
    if (!waitForProgress(seen, kWaitSlice)) return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
}

std::optional<std::pair<std::uint64_t, CUresult>> DataPlane::waitForAny(
    std::span<const std::uint64_t> tokens) {
  std::uint32_t seen = 0;
  {
    std::lock_guard lock(completionMutex_);
    seen = completionWordValue();
    drainLocked();
    for (const std::uint64_t token : tokens) {
      if (auto found = results_.find(token); found != results_.end()) {
        const CUresult result = found->second;
        results_.erase(found);
        return std::pair{token, result};
      }
    }
  }
  if (!waitForProgress(seen, kWaitSlice)) {
    return std::pair{std::uint64_t{0}, CUDA_ERROR_MPS_CONNECTION_FAILED};
  }
  return std::nullopt;
}

CUresult DataPlane::synchronize(std::uint64_t context, ring::SynchronizeKind kind,
                                std::uint64_t handle, bool query) {
  ring::Synchronize command;
  command.context = context;
  command.kind = kind;
  command.handle = handle;
  command.completionToken = newToken();
  command.query = query;
  if (CUresult submitted = submitCommand(command); submitted != CUDA_SUCCESS) {
    return submitted;
  }
  const CUresult answer = waitFor(command.completionToken);
  if (answer == CUDA_ERROR_MPS_CONNECTION_FAILED) return answer;
  std::lock_guard lock(completionMutex_);
  drainLocked();
  // A synchronisation may be where the client first hears of a fault: latch it like one that
  // came as an AsyncError, so that the calls after it fail too.
  asyncErrors_.noteSticky(context, answer);
  anySticky_.store(asyncErrors_.anySticky(), std::memory_order_relaxed);
  const CUresult latched = takeErrorLocked(context, kind, handle);
  return latched != CUDA_SUCCESS ? latched : answer;
}

CUresult DataPlane::takeErrorLocked(std::uint64_t context, ring::SynchronizeKind kind,
                                    std::uint64_t handle) {
  switch (kind) {
    case ring::SynchronizeKind::kStream:
      return asyncErrors_.takeForStream(context, handle);
    case ring::SynchronizeKind::kEvent: {
      auto stream = eventStreams_.find(handle);
      // Never recorded: it covers no work, so only a sticky error concerns it.
      if (stream == eventStreams_.end()) return asyncErrors_.sticky(context);
      return asyncErrors_.takeForStream(context, stream->second);
    }
    case ring::SynchronizeKind::kContext:
      return asyncErrors_.takeForContext(context);
  }
  return asyncErrors_.takeForContext(context);
}

CUresult DataPlane::takeAsyncError(std::uint64_t context) {
  std::lock_guard lock(completionMutex_);
  drainLocked();
  return takeErrorLocked(context, ring::SynchronizeKind::kContext, 0);
}

CUresult DataPlane::stickyErrorSlow(std::uint64_t context) {
  std::lock_guard lock(completionMutex_);
  drainLocked();
  return asyncErrors_.sticky(context);
}

void DataPlane::noteContext(std::uint64_t context, std::uint32_t ordinal) {
  std::lock_guard lock(submitMutex_);
  // A device without a ring of its own cannot be: the daemon makes one per device it lets the
  // session see. Ring 0 then, where the daemon refuses the context's records.
  contextRings_[context] = ordinal < commandRings_.size() ? ordinal : 0;
}

void DataPlane::forgetContextRing(std::uint64_t context) {
  std::lock_guard lock(submitMutex_);
  contextRings_.erase(context);
}

void DataPlane::forgetContext(std::uint64_t context) {
  std::lock_guard lock(completionMutex_);
  drainLocked();
  asyncErrors_.forget(context);
  anySticky_.store(asyncErrors_.anySticky(), std::memory_order_relaxed);
}

void DataPlane::noteEventRecorded(std::uint64_t event, std::uint64_t stream) {
  std::lock_guard lock(completionMutex_);
  eventStreams_[event] = stream;
}

void DataPlane::forgetEvent(std::uint64_t event) {
  std::lock_guard lock(completionMutex_);
  eventStreams_.erase(event);
}

std::optional<StagingAllocator::Range> DataPlane::allocateStaging(
    std::uint64_t bytes, const std::function<bool()>& progress) {
  for (;;) {
    std::uint32_t seen = 0;
    {
      std::lock_guard lock(completionMutex_);
      seen = completionWordValue();
      drainLocked();
      if (auto range = stagingAllocator_.allocate(bytes)) return range;
    }
    if (progress && progress()) continue;
    // Space also comes back from this process's own threads (staged D2H chunks), which does not
    // move the daemon's counter: look again soon.
    if (!waitForProgress(seen, kStagingWaitSlice)) return std::nullopt;
  }
}

void DataPlane::releaseStaging(const StagingAllocator::Range& range) {
  std::lock_guard lock(completionMutex_);
  if (!stagingAllocator_.release(range)) {
    GPUPROXY_STUB_LOG(kError, "data plane: staging range [%llu, +%llu) released twice",
                      static_cast<unsigned long long>(range.offset),
                      static_cast<unsigned long long>(range.bytes));
  }
}

}  // namespace gpuproxy::stub
