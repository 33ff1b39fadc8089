#pragma once
// The seam between the daemon's data-plane loop and the kernel's readiness interface: wait until
// any of a set of descriptors (client doorbell eventfds, pidfds of client processes) is readable,
// with a timeout, and let another thread interrupt the wait.
//
// Two implementations: io_uring (poll requests on a submission ring) and epoll. io_uring is
// preferred where it exists, but Kubernetes' RuntimeDefault seccomp profile and older kernels
// refuse io_uring_setup, and measurements show no gain for a handful of wake-ups (the hot path
// spins on shared memory and does not reach the kernel at all; reference/remoting-tech.md §7.3),
// so epoll is a complete fallback rather than a degraded mode. newPoller(kAuto) probes io_uring
// once and says which one it chose.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

namespace gpuproxy::ipc {

class Poller {
public:
  // Reserved: wait() never reports it, and add() refuses it.
  static constexpr std::uint64_t kReservedToken = ~std::uint64_t{0};

  virtual ~Poller() = default;

  // Watches `fd` for readability (level-triggered: a descriptor that stays readable is reported
  // by every wait()) and reports it as `token`. The descriptor is borrowed: remove it before
  // closing it. Throws std::system_error (e.g. EEXIST when already added).
  virtual void add(int fd, std::uint64_t token) = 0;
  // Stops watching `fd`. Throws std::system_error (ENOENT) when it was not added.
  virtual void remove(int fd) = 0;

  // Waits until at least one watched descriptor is readable, wake() is called, or `timeout`
  // passes (negative: no limit; zero: just look); signals do not end it early. Replaces `ready`
  // with the tokens of readable descriptors, each once; empty after a timeout or a wake(). Throws
  // std::system_error on failures that are bugs or broken environments (EBADF, ENOMEM).
  virtual void wait(std::vector<std::uint64_t>& ready, std::chrono::nanoseconds timeout) = 0;

  // A descriptor that is readable whenever a wait() with zero timeout would report something, so
  // that another event loop (the daemon's kj loop) can sleep on all of the poller's descriptors
  // at once: arm with wait(ready, 0), sleep until this is readable, then harvest with
  // wait(ready, 0). The epoll instance itself, or the io_uring's ring descriptor (readable while
  // completions are queued). Borrowed; valid for the poller's lifetime.
  virtual int readinessFd() const noexcept = 0;
  // Thread-safe and async-signal-safe: makes the current (or next) wait() return promptly.
  virtual void wake() noexcept = 0;

  // "io_uring" or "epoll", for logs and `gpuproxyctl status`.
  virtual std::string_view backendName() const noexcept = 0;
};

// Throws std::system_error when the kernel (or a seccomp profile) refuses io_uring or lacks
// IORING_OP_POLL_ADD / IORING_OP_POLL_REMOVE.
std::unique_ptr<Poller> newIoUringPoller();
std::unique_ptr<Poller> newEpollPoller();

enum class PollerBackend { kAuto, kIoUring, kEpoll };

// kAuto: io_uring if the probe succeeds, otherwise epoll, reporting the reason through `log`
// (one line). Explicit choices throw when unavailable. `log` may be empty.
std::unique_ptr<Poller> newPoller(PollerBackend backend,
                                  const std::function<void(std::string_view)>& log = {});

}  // namespace gpuproxy::ipc
