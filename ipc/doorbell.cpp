#include "ipc/doorbell.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <system_error>

namespace gpuproxy::ipc {

UniqueFd makeEventFd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd) throw std::system_error(errno, std::generic_category(), "eventfd");
  return fd;
}

void yieldCpu() noexcept {
  ::sched_yield();
}

std::uint64_t drainEventFd(int eventFd) noexcept {
  std::uint64_t count = 0;
  iovec io{&count, sizeof(count)};
  for (;;) {
    // O_NONBLOCK belongs to the open file description, which the client shares and can change
    // with fcntl; RWF_NOWAIT belongs to this call alone.
    const ssize_t result = ::preadv2(eventFd, &io, 1, -1, RWF_NOWAIT);
    if (result == sizeof(count)) return count;
    if (result < 0 && errno == EINTR) continue;
    if (result < 0 && (errno == EOPNOTSUPP || errno == EINVAL)) break;  // kernel < 5.12
    return 0;                                                           // EAGAIN: already empty
  }
  for (;;) {
    const ssize_t result = ::read(eventFd, &count, sizeof(count));
    if (result == sizeof(count)) return count;
    if (result < 0 && errno == EINTR) continue;
    return 0;
  }
}

// ---- DoorbellRinger ----

bool DoorbellRinger::ring() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // W2
  std::atomic_ref<std::uint32_t> sleeping(sleeping_);
  // W3. The plain load keeps the common case (consumer awake) to a read of a line that stays in
  // our cache; only when it says "asleep" do we take the line with an exchange. The exchange
  // makes exactly one of several rings after one announcement pay for the syscall.
  if (sleeping.load(std::memory_order_relaxed) == 0) return false;
  if (sleeping.exchange(0, std::memory_order_relaxed) == 0) return false;
  const std::uint64_t one = 1;
  for (;;) {
    const ssize_t result = ::write(eventFd_, &one, sizeof(one));
    // EAGAIN: the counter is saturated, so the consumer has a wake-up pending anyway.
    if (result >= 0 || errno != EINTR) break;
  }
  ++wakeups_;
  return true;
}

// ---- DoorbellWaiter ----

void DoorbellWaiter::prepareToSleep() noexcept {
  std::atomic_ref<std::uint32_t>(sleeping_).store(1, std::memory_order_relaxed);  // S1
  std::atomic_thread_fence(std::memory_order_seq_cst);                            // S2
}

void DoorbellWaiter::finishSleep() noexcept {
  std::atomic_ref<std::uint32_t>(sleeping_).store(0, std::memory_order_relaxed);
  // A ring that saw the announcement may have written the eventfd even though we did not block
  // (or after we woke); clear it so the next sleep does not return at once for nothing.
  drainEventFd(eventFd_);
}

bool DoorbellWaiter::block(std::chrono::milliseconds timeout) noexcept {
  ++sleeps_;
  pollfd entry{eventFd_, POLLIN, 0};
  const int milliseconds = timeout.count() < 0         ? -1
                           : timeout.count() > INT_MAX ? INT_MAX
                                                       : static_cast<int>(timeout.count());
  for (;;) {
    const int result = ::poll(&entry, 1, milliseconds);
    if (result > 0) return true;
    if (result == 0) return false;
    // EINTR: report a wake-up; the caller re-checks its work and the deadline.
    if (errno == EINTR) return true;
    return false;
  }
}

// ---- CompletionPublisher / CompletionWaiter ----

namespace {

// Shared (not FUTEX_PRIVATE_FLAG) futexes: the word lives in a MAP_SHARED mapping of another
// process, and the kernel must key the wait queue by the underlying page, not our mm.
long futex(std::uint32_t* word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

}  // namespace

void CompletionPublisher::publishMore(std::uint32_t records) noexcept {
  std::atomic_ref<std::uint32_t>(word_.value).fetch_add(records, std::memory_order_release);  // W1
  std::atomic_thread_fence(std::memory_order_seq_cst);                                        // W2
  if (std::atomic_ref<std::uint32_t>(word_.waiters).load(std::memory_order_relaxed) == 0) {
    return;  // W3: nobody blocked; the spinning client sees the store by itself
  }
  futex(&word_.value, FUTEX_WAKE, INT_MAX, nullptr);
  ++wakes_;
}

bool CompletionWaiter::block(std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  timespec relative{};
  const timespec* limit = nullptr;
  if (timeout.count() >= 0) {
    relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    limit = &relative;
  }
  const long result = futex(&word_.value, FUTEX_WAIT, expected, limit);
  // EAGAIN (value already changed) and EINTR count as wake-ups: the caller re-checks.
  return result == 0 || errno != ETIMEDOUT;
}

}  // namespace gpuproxy::ipc
