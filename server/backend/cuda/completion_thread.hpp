#pragma once
// The per-device thread that runs completion callbacks for the cuda backend.
//
// CUDA forbids CUDA calls inside cuLaunchHostFunc host functions, and those run on the driver's
// own callback thread, which every stream of the process shares. So a host function only moves
// its item to this thread's queue; the item's work (reading kernel times, running the daemon's
// callback) happens here.
//
// After a sticky fault the driver never calls host functions enqueued before it ("in contrast to
// cuStreamAddCallback, the function will not be called in the event of an error in the CUDA
// context"), so items still expected then are failed with the sticky error: callers always hear
// back exactly once. While items are expected and none arrives, the thread runs a probe every
// kProbeInterval to notice such a fault.

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

namespace gpuproxy::server::cuda {

class CompletionThread {
public:
  // Runs on this thread with CUDA_SUCCESS (or the status the item was failed with).
  using Work = std::function<void(CUresult status)>;
  // Runs on this thread; fails expected items itself (failExpected) when it finds a fault.
  using Probe = std::function<void()>;

  static constexpr std::chrono::milliseconds kProbeInterval{100};

  CompletionThread(std::string name, Probe probe);
  ~CompletionThread();  // stop()s
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  // Registers `work` to run when hostFunction(userData) is called; returns that userData. Call it
  // before cuLaunchHostFunc: the host function may run before cuLaunchHostFunc returns.
  void* expect(Work work);
  // cuLaunchHostFunc failed for `userData`: forgets it and hands its work back, not run.
  Work cancel(void* userData);
  // Pass to cuLaunchHostFunc with a userData from expect().
  static void CUDA_CB hostFunction(void* userData);

  // Runs `work` with `status` soon, on this thread.
  void post(Work work, CUresult status);
  // Every expected item runs with `status`: its host function will never be called (the
  // context faulted or is about to be destroyed). A host function that still comes is ignored.
  void failExpected(CUresult status);

  // Waits until no item is expected, at most `limit`; true if none is.
  bool waitUntilNothingExpected(std::chrono::milliseconds limit);
  // Waits until every posted and released item has run.
  void drain();
  // Runs what is queued, fails what is still expected with CUDA_ERROR_CONTEXT_IS_DESTROYED, and
  // joins the thread. Idempotent.
  void stop();

private:
  struct State;
  struct Token;

  static void run(const std::shared_ptr<State>& state, const Probe& probe);

  // Shared with the host functions' userData (as weak references), so a host function that
  // arrives after this object is gone finds nothing instead of freed memory.
  std::shared_ptr<State> state_;
  Probe probe_;
  std::thread thread_;
};

}  // namespace gpuproxy::server::cuda
