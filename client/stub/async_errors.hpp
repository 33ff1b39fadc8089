#pragma once
// What the daemon reported about asynchronous commands that failed, kept until the call at which
// CUDA reports them (protocol/RING_FORMAT.md, "Errors"). Plain bookkeeping without locks or I/O:
// the DataPlane holds it under its completion mutex, and unit tests drive it directly.
//
// - A sticky error (a kernel fault: protocol::isStickyError) makes the context unusable. Every
// later
//   call on that context returns it, asynchronous ones included, until the context is destroyed or
//   reset (forget()).
// - Any other error is returned once, by the first call that synchronises with the stream the
//   failed command ran on: a synchronise or query of that stream or of an event recorded on it, or
//   a call that synchronises with the whole context (cuCtxSynchronize, blocking copies, and the
//   legacy NULL stream, which waits for the context's other streams).

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "protocol/cuda_result.hpp"
#include "protocol/ring_format.hpp"

namespace gpuproxy::stub {

class AsyncErrors {
public:
  void record(const protocol::ring::AsyncError& error) {
    if (error.result == CUDA_SUCCESS) return;
    if (protocol::isStickyError(error.result)) {
      noteSticky(error.context, error.result);
      return;
    }
    Latched& latched = contexts_[error.context];
    // The first failure of a stream is the one reported; later ones are its consequences.
    latched.byStream.try_emplace(error.stream, Failure{error.sequence, error.result});
  }

  // For a call that synchronises with `stream` of `context` (0: the legacy NULL stream, which
  // synchronises with the whole context). Clears what it returns unless it is sticky.
  CUresult takeForStream(std::uint64_t context, std::uint64_t stream) {
    if (stream == 0) return takeForContext(context);
    auto found = contexts_.find(context);
    if (found == contexts_.end()) return CUDA_SUCCESS;
    Latched& latched = found->second;
    if (latched.sticky != CUDA_SUCCESS) return latched.sticky;
    auto failure = latched.byStream.find(stream);
    if (failure == latched.byStream.end()) return CUDA_SUCCESS;
    const CUresult result = failure->second.result;
    latched.byStream.erase(failure);
    return result;
  }

  // For a call that synchronises with all of `context`: the earliest failure of any stream, and
  // every non-sticky one is cleared (CUDA reports one error per synchronisation).
  CUresult takeForContext(std::uint64_t context) {
    auto found = contexts_.find(context);
    if (found == contexts_.end()) return CUDA_SUCCESS;
    Latched& latched = found->second;
    if (latched.sticky != CUDA_SUCCESS) return latched.sticky;
    if (latched.byStream.empty()) return CUDA_SUCCESS;
    const auto earliest = std::min_element(
        latched.byStream.begin(), latched.byStream.end(),
        [](const auto& a, const auto& b) { return a.second.sequence < b.second.sequence; });
    const CUresult result = earliest->second.result;
    latched.byStream.clear();
    return result;
  }

  // `result`, whatever answer it came in (an AsyncError record, a synchronisation's answer), if
  // it is a sticky error: from now on every call of `context` returns it, as the driver's do.
  void noteSticky(std::uint64_t context, CUresult result) {
    if (!protocol::isStickyError(result)) return;
    Latched& latched = contexts_[context];
    if (latched.sticky == CUDA_SUCCESS) {
      latched.sticky = result;
      ++stickyContexts_;
    }
  }

  // The sticky error of `context`, CUDA_SUCCESS while it has none. Left in place.
  CUresult sticky(std::uint64_t context) const {
    if (stickyContexts_ == 0) return CUDA_SUCCESS;
    auto found = contexts_.find(context);
    return found == contexts_.end() ? CUDA_SUCCESS : found->second.sticky;
  }

  // Whether any context has a sticky error (a cheap test before sticky()).
  bool anySticky() const { return stickyContexts_ != 0; }

  // The context was destroyed or reset: nothing of it is reported any more.
  void forget(std::uint64_t context) {
    auto found = contexts_.find(context);
    if (found == contexts_.end()) return;
    if (found->second.sticky != CUDA_SUCCESS) --stickyContexts_;
    contexts_.erase(found);
  }

private:
  struct Failure {
    std::uint64_t sequence = 0;
    CUresult result = CUDA_SUCCESS;
  };
  struct Latched {
    CUresult sticky = CUDA_SUCCESS;
    std::map<std::uint64_t, Failure> byStream;  // stream -> its first failure
  };

  std::unordered_map<std::uint64_t, Latched> contexts_;
  std::uint64_t stickyContexts_ = 0;  // contexts whose `sticky` is set
};

}  // namespace gpuproxy::stub
