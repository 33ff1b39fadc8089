#include "server/gpu/blocking_call_thread.hpp"

#include <pthread.h>

namespace gpuproxy::server {

BlockingCallThread::BlockingCallThread(std::string name)
    : name_(std::move(name)), thread_([this]() { serve(); }) {}

BlockingCallThread::~BlockingCallThread() {
  std::deque<kj::Function<void()>> dropped;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  wake_.notify_one();
  thread_.join();
  // Destroyed here, on the owner thread: their fulfillers reject the promises still waiting.
  dropped.clear();
}

void BlockingCallThread::enqueue(kj::Function<void()> call) {
  ++pending_;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(kj::mv(call));
  }
  wake_.notify_one();
}

BlockingCallThread::Stats BlockingCallThread::stats() const {
  return Stats{completed_.load(), nanoseconds_.load(), pending_.load()};
}

void BlockingCallThread::serve() {
  const std::string threadName = name_.substr(0, 15);
  ::pthread_setname_np(::pthread_self(), threadName.c_str());
  while (true) {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [this]() { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    kj::Function<void()> call = kj::mv(queue_.front());
    queue_.pop_front();
    lock.unlock();
    call();  // counts itself (noteEnded) before it answers
    // The call's own state (its arguments, a fulfiller nobody waits on) ends here, off the owner
    // thread.
  }
}

void BlockingCallThread::noteEnded(std::chrono::steady_clock::time_point started) {
  const auto took = std::chrono::steady_clock::now() - started;
  nanoseconds_ += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
  ++completed_;
  --pending_;
}

}  // namespace gpuproxy::server
