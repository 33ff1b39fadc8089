#pragma once
// The thread that owns a piece of state. State of the daemon's GPUs is touched by one thread only
// (the shard's owner), which is why none of it needs a lock; a call from any other thread is a bug
// of ours, and this check finds it where the state is touched instead of as a data race later.

#include <kj/debug.h>

#include <thread>

namespace gpuproxy::server {

class OwnerThread {
public:
  // Owned by the constructing thread.
  OwnerThread() : id_(std::this_thread::get_id()) {}

  bool isCurrent() const { return std::this_thread::get_id() == id_; }
  // Throws (KJ_ASSERT: our bug) when called on any other thread. Costs one load and a compare.
  void check() const { KJ_ASSERT(isCurrent(), "GPU state touched off its owner thread"); }

private:
  std::thread::id id_;
};

}  // namespace gpuproxy::server
