#pragma once
// A GPU's thread for the backend calls that may block for long: preparing a module (a fatbin's
// decompression, PTX decoding, the driver's JIT, which can take seconds) and pinning a client's
// host memory. The shard's owner thread hands such a call here and goes on serving every client's
// commands and the admin socket; the answer comes back as a promise on the owner's event loop.
// Calls run one at a time, in the order given, so one GPU's slow calls queue behind each other
// and never behind another GPU's.
//
// Threading: the constructor, run(), stats() and the destructor are the owner thread's. The calls
// run on this object's thread and may touch only what the backend contract lets another thread
// touch (backend.hpp). A call's answer is delivered through a cross-thread promise: when the
// owner has dropped the promise, the answer is destroyed on this thread, so it must not be
// anything that belongs to the owner thread.

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/function.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace gpuproxy::server {

class BlockingCallThread {
public:
  // `name` becomes the thread's name (at most 15 characters are kept), as ps and top show it.
  explicit BlockingCallThread(std::string name);
  // Waits for the call running now; calls not yet started are dropped, rejecting their promises.
  ~BlockingCallThread();
  BlockingCallThread(const BlockingCallThread&) = delete;
  BlockingCallThread& operator=(const BlockingCallThread&) = delete;

  // Runs `call` on this thread after the calls given before it. An exception it throws rejects
  // the promise.
  template <typename Call>
  kj::Promise<std::invoke_result_t<Call&>> run(Call&& call) {
    using Answer = std::invoke_result_t<Call&>;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<Answer>();
    // What the call wrote (its answer, or state it shares with its caller) is ordered before the
    // caller's continuation by this release/acquire pair as well as by kj's fulfilment, whose
    // ordering sits in uninstrumented libkj-async where ThreadSanitizer cannot see it
    // (tests/tsan.supp; server/gpu/completion.cpp does the same for backend callbacks).
    auto handOff = std::make_shared<std::atomic<bool>>(false);
    enqueue([this, call = std::forward<Call>(call), fulfiller = kj::mv(paf.fulfiller),
             handOff]() mutable {
      // The call is counted as ended before its answer is delivered, so that whoever gets the
      // answer finds it in stats().
      const auto started = std::chrono::steady_clock::now();
      if constexpr (std::is_void_v<Answer>) {
        kj::Maybe<kj::Exception> error = kj::runCatchingExceptions([&]() { call(); });
        noteEnded(started);
        handOff->store(true, std::memory_order_release);
        KJ_IF_MAYBE (exception, error) {
          fulfiller->reject(kj::mv(*exception));
        } else {
          fulfiller->fulfill();
        }
      } else {
        kj::Maybe<Answer> answer;
        kj::Maybe<kj::Exception> error = kj::runCatchingExceptions([&]() { answer = call(); });
        noteEnded(started);
        handOff->store(true, std::memory_order_release);
        KJ_IF_MAYBE (exception, error) {
          fulfiller->reject(kj::mv(*exception));
        } else {
          fulfiller->fulfill(kj::mv(KJ_ASSERT_NONNULL(answer)));
        }
      }
    });
    if constexpr (std::is_void_v<Answer>) {
      return paf.promise.then([handOff]() { (void)handOff->load(std::memory_order_acquire); });
    } else {
      return paf.promise.then([handOff](Answer answer) {
        (void)handOff->load(std::memory_order_acquire);
        return answer;
      });
    }
  }

  struct Stats {
    std::uint64_t completed = 0;    // calls that have ended
    std::uint64_t nanoseconds = 0;  // time those calls took, all together
    std::uint32_t pending = 0;      // calls given and not yet ended (queued or running)
  };
  Stats stats() const;

private:
  void enqueue(kj::Function<void()> call);
  void serve();
  void noteEnded(std::chrono::steady_clock::time_point started);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<kj::Function<void()>> queue_;  // guarded by mutex_
  bool stopping_ = false;                   // guarded by mutex_
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> nanoseconds_{0};
  std::atomic<std::uint32_t> pending_{0};
  std::string name_;
  std::thread thread_;  // last: started once everything it reads exists
};

}  // namespace gpuproxy::server
