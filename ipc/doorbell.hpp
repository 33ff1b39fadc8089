#pragma once
// Waking a sleeping peer without making a busy one pay for it.
//
// Client → daemon (command rings): the daemon's consumer spins while there is work, then
// announces in shared memory that it is about to sleep, re-checks its rings, and blocks on an
// eventfd (through the Poller, together with every other client's doorbell). The client, after
// publishing a record, looks at the announcement and writes the eventfd only if it is set: while
// the daemon is awake a launch costs the client no syscall.
//
// Daemon → client (completions): the client waits on a 32-bit word in shared memory with a futex;
// the daemon stores the new value and calls FUTEX_WAKE only if a waiter announced itself. The
// daemon never blocks on anything a client controls: FUTEX_WAKE never blocks, and the daemon
// drains doorbells with a read that cannot block even if the client cleared O_NONBLOCK on the
// eventfd they share (drainEventFd). The daemon must not use DoorbellRinger towards a client: an
// eventfd write blocks once the counter is full, and the client controls both.
//
// Why no wake-up is lost (both directions are the same "store buffering" pattern):
//
//   waker (producer)                        sleeper (consumer)
//   W1 publish: store index (release)       S1 store sleeping = 1
//   W2 atomic_thread_fence(seq_cst)         S2 atomic_thread_fence(seq_cst)
//   W3 load sleeping; if 1: wake            S3 load index; if new: do not sleep
//
// Without the fences both loads may read the old values (each store still sits in its CPU's store
// buffer): the waker sees "awake" and does not wake, the sleeper sees "nothing new" and sleeps:
// a record that waits forever. With a seq_cst fence between each side's store and load, the two
// fences are ordered one way or the other, and the side whose fence comes second must see the
// other side's store: either the waker sees sleeping = 1 and wakes (the eventfd counter or the
// futex value check keeps that wake even if it lands before the sleeper blocks), or the sleeper
// sees the new index and stays up. Both may happen; the cost is a spurious wake-up, drained later.
// Release/acquire alone is not enough: it orders each side's own accesses, not a store against a
// later load.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

#include "ipc/unique_fd.hpp"

namespace gpuproxy::ipc {

// A non-blocking, close-on-exec eventfd. Throws std::system_error.
UniqueFd makeEventFd();

// Clears an eventfd's counter without ever blocking, even when another process sharing the
// descriptor has switched it to blocking mode (uses RWF_NOWAIT; kernels before 5.12 fall back to
// a plain read, which then relies on O_NONBLOCK). Returns the count read (0 when it was empty).
std::uint64_t drainEventFd(int eventFd) noexcept;

// A short pause inside spin loops (x86 PAUSE / Arm YIELD): gentler on the sibling hyperthread
// and on power than a bare loop, and it avoids the memory-order mis-speculation flush on exit.
inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Gives the CPU to another runnable thread, if one waits for it, and returns at once otherwise
// (sched_yield). Every spin loop that waits for another process calls it now and then: the
// scheduler likes to wake a process on the CPU of the thread that woke it, and if that thread then
// spins there, the process it is waiting for sits in the run queue behind it until the spin ends
// (measured: 50-60 µs added to every call that found the daemon asleep).
void yieldCpu() noexcept;

// Producer side of an eventfd doorbell. `sleeping` is the consumer's announcement in shared memory
// (RingHeader::consumerSleeping); both are borrowed.
class DoorbellRinger {
public:
  DoorbellRinger(std::uint32_t& sleeping, int eventFd) : sleeping_(sleeping), eventFd_(eventFd) {}

  // Call after publishing (W2, W3 above). Writes the eventfd only when the consumer announced
  // sleep, and then clears the announcement, so a burst of records arriving while the consumer
  // wakes up costs one syscall, not one each. Returns whether it wrote the eventfd.
  bool ring() noexcept;

  // eventfd writes so far (a busy consumer should keep this at zero).
  std::uint64_t wakeupsSent() const { return wakeups_; }

private:
  std::uint32_t& sleeping_;
  int eventFd_;
  std::uint64_t wakeups_ = 0;
};

// Consumer side of an eventfd doorbell.
//
// A consumer serving many rings (the daemon) uses the two halves around its Poller:
//   for each ring: waiter.prepareToSleep();
//   if no ring is pending(): poller.wait(...)   // the eventfds are registered with the poller
//   for each ring: waiter.finishSleep();
// A consumer of one ring uses wait().
class DoorbellWaiter {
public:
  DoorbellWaiter(std::uint32_t& sleeping, int eventFd) : sleeping_(sleeping), eventFd_(eventFd) {}

  // S1, S2 above. After it, re-check the ring (S3) before blocking.
  void prepareToSleep() noexcept;
  // Withdraws the announcement and clears the eventfd, after blocking or deciding not to.
  void finishSleep() noexcept;

  // Spins `spinIterations` times on `hasWork`, then sleeps on the eventfd until `hasWork` holds
  // or `timeout` passes (negative: no limit). Returns whether there is work.
  template <class HasWork>
  bool wait(HasWork&& hasWork, std::uint32_t spinIterations, std::chrono::milliseconds timeout);

  // Times this waiter actually blocked in the kernel.
  std::uint64_t sleeps() const { return sleeps_; }

private:
  // Blocks in poll() until the eventfd is readable or `timeout` passes; false on timeout.
  bool block(std::chrono::milliseconds timeout) noexcept;

  std::uint32_t& sleeping_;
  int eventFd_;
  std::uint64_t sleeps_ = 0;
};

template <class HasWork>
bool DoorbellWaiter::wait(HasWork&& hasWork, std::uint32_t spinIterations,
                          std::chrono::milliseconds timeout) {
  for (std::uint32_t i = 0; i < spinIterations; ++i) {
    if (hasWork()) return true;
    cpuRelax();
    if (i % 64 == 63) yieldCpu();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    prepareToSleep();
    if (hasWork()) {
      finishSleep();
      return true;
    }
    std::chrono::milliseconds left = timeout;
    if (timeout.count() >= 0) {
      left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
    }
    const bool woken = block(left);
    finishSleep();
    if (hasWork()) return true;
    // A wake-up without work is a stale eventfd count (a wake that raced with an earlier re-check
    // that found work); go round again until the deadline.
    if (!woken) return false;
  }
}

// Two 32-bit words in shared memory for daemon → client completions. `value` is whatever the two
// sides agree on (a completed ticket, a status); `waiters` counts clients blocked on it.
struct CompletionWord {
  std::uint32_t value;
  std::uint32_t waiters;
};
static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free);

// The daemon's side: moves the value on and wakes blocked waiters. Never blocks. Several
// publishers may share one word (one per completion ring, each on its own thread): each adds what
// it published, so the value only ever moves on and a waiter that saw it change drains them all.
class CompletionPublisher {
public:
  explicit CompletionPublisher(CompletionWord& word) : word_(word) {}
  // Adds `records` (wrapping) to the value.
  void publishMore(std::uint32_t records) noexcept;
  // FUTEX_WAKE calls so far (zero while the client only spins).
  std::uint64_t wakesSent() const { return wakes_; }

private:
  CompletionWord& word_;
  std::uint64_t wakes_ = 0;
};

// The client's side: waits until `done(value)` holds.
class CompletionWaiter {
public:
  explicit CompletionWaiter(CompletionWord& word) : word_(word) {}

  // Spins `spinIterations` times, then blocks on the futex until `done(value)` holds or `timeout`
  // passes (negative: no limit). Returns the value that satisfied `done`, or nullopt on timeout.
  template <class Done>
  std::optional<std::uint32_t> wait(Done&& done, std::uint32_t spinIterations,
                                    std::chrono::milliseconds timeout);

  std::uint32_t load() const {
    return std::atomic_ref<std::uint32_t>(word_.value).load(std::memory_order_acquire);
  }

private:
  // One futex wait while value == expected; false on timeout.
  bool block(std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept;

  CompletionWord& word_;
};

template <class Done>
std::optional<std::uint32_t> CompletionWaiter::wait(Done&& done, std::uint32_t spinIterations,
                                                    std::chrono::milliseconds timeout) {
  for (std::uint32_t i = 0; i < spinIterations; ++i) {
    const std::uint32_t value = load();
    if (done(value)) return value;
    cpuRelax();
    if (i % 64 == 63) yieldCpu();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::atomic_ref<std::uint32_t> waiters(word_.waiters);
  for (;;) {
    waiters.fetch_add(1, std::memory_order_seq_cst);      // S1
    std::atomic_thread_fence(std::memory_order_seq_cst);  // S2
    const std::uint32_t value = load();                   // S3
    bool timedOut = false;
    if (!done(value)) {
      std::chrono::nanoseconds left = std::chrono::nanoseconds(-1);
      if (timeout.count() >= 0) {
        left = deadline - std::chrono::steady_clock::now();
        if (left.count() < 0) left = std::chrono::nanoseconds(0);
      }
      // The kernel re-checks value == expected atomically with queueing us, so a publish after
      // our load returns at once (EAGAIN) instead of being missed.
      timedOut = !block(value, left);
    }
    waiters.fetch_sub(1, std::memory_order_relaxed);
    const std::uint32_t now = load();
    if (done(now)) return now;
    if (timedOut) return std::nullopt;
  }
}

}  // namespace gpuproxy::ipc
