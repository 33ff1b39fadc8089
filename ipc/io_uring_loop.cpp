#include "ipc/io_uring_loop.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <unordered_map>

#include "ipc/doorbell.hpp"
#include "ipc/unique_fd.hpp"

namespace gpuproxy::ipc {

namespace {

[[noreturn]] void throwError(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

// The end of a wait that may be interrupted and resumed. Interruptions are not only signals: the
// kernel's io_uring task work also ends an epoll wait early with EINTR in a process that uses
// both, so a wait resumes with what is left of its timeout rather than returning early.
class Deadline {
public:
  explicit Deadline(std::chrono::nanoseconds timeout)
      : infinite_(timeout.count() < 0), end_(std::chrono::steady_clock::now() + timeout) {}
  // Negative: no limit.
  std::chrono::nanoseconds left() const {
    if (infinite_) return std::chrono::nanoseconds(-1);
    return std::max(std::chrono::nanoseconds(0), end_ - std::chrono::steady_clock::now());
  }

private:
  bool infinite_;
  std::chrono::steady_clock::time_point end_;
};

void checkToken(std::uint64_t token) {
  if (token == Poller::kReservedToken) throwError(EINVAL, "Poller token ~0 is reserved");
}

void signalEventFd(int fd) noexcept {
  const std::uint64_t one = 1;
  // EAGAIN (counter saturated) still leaves the descriptor readable, which is all wake() needs.
  while (::write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

// ---- epoll ----

class EpollPoller final : public Poller {
public:
  EpollPoller() : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_(makeEventFd()) {
    if (!epoll_) throwError(errno, "epoll_create1");
    control(EPOLL_CTL_ADD, wake_.get(), kReservedToken, "epoll_ctl(ADD wake eventfd)");
  }

  // gpuproxy::ipc::Poller
  void add(int fd, std::uint64_t token) override {
    checkToken(token);
    control(EPOLL_CTL_ADD, fd, token, "epoll_ctl(ADD fd " + std::to_string(fd) + ")");
  }

  void remove(int fd) override {
    control(EPOLL_CTL_DEL, fd, 0, "epoll_ctl(DEL fd " + std::to_string(fd) + ")");
  }

  void wait(std::vector<std::uint64_t>& ready, std::chrono::nanoseconds timeout) override {
    ready.clear();
    epoll_event events[64];
    const Deadline deadline(timeout);
    int count = 0;
    while ((count = waitRaw(events, 64, deadline.left())) < 0) {
      if (errno != EINTR) throwError(errno, "epoll_wait");
    }
    for (int i = 0; i < count; ++i) {
      if (events[i].data.u64 == kReservedToken) {
        drainEventFd(wake_.get());
        continue;
      }
      ready.push_back(events[i].data.u64);
    }
  }

  void wake() noexcept override { signalEventFd(wake_.get()); }

  int readinessFd() const noexcept override { return epoll_.get(); }

  std::string_view backendName() const noexcept override { return "epoll"; }

private:
  void control(int op, int fd, std::uint64_t token, const std::string& what) {
    epoll_event event{};
    event.events = EPOLLIN;  // level-triggered
    event.data.u64 = token;
    if (::epoll_ctl(epoll_.get(), op, fd, &event) != 0) throwError(errno, what);
  }

  int waitRaw(epoll_event* events, int capacity, std::chrono::nanoseconds timeout) {
    if (hasPwait2_) {
      timespec limit{};
      limit.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
      limit.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
      const int count = ::epoll_pwait2(epoll_.get(), events, capacity,
                                       timeout.count() < 0 ? nullptr : &limit, nullptr);
      if (count >= 0 || (errno != ENOSYS && errno != EPERM)) return count;
      // Kernels before 5.11 and some seccomp profiles lack epoll_pwait2: millisecond timeouts,
      // rounded up so that a short timeout does not become a busy loop.
      hasPwait2_ = false;
    }
    const auto milliseconds =
        timeout.count() < 0 ? -1 : std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
    return ::epoll_wait(epoll_.get(), events, capacity,
                        static_cast<int>(std::min<std::int64_t>(milliseconds, INT32_MAX)));
  }

  UniqueFd epoll_;
  UniqueFd wake_;
  bool hasPwait2_ = true;
};

// ---- io_uring ----

// Each watched descriptor has one one-shot POLL_ADD in flight; when it completes, the descriptor
// is reported and re-armed at the next wait(), which gives level-triggered behaviour (a poll on a
// still-readable descriptor completes at once). user_data carries the descriptor and a generation
// number, so completions of polls that were removed (or belong to an earlier registration of the
// same descriptor number) are recognised and dropped.
class IoUringPoller final : public Poller {
public:
  IoUringPoller() {
    const int result = ::io_uring_queue_init(kEntries, &ring_, 0);
    if (result < 0) throwError(-result, "io_uring_queue_init");
    try {
      io_uring_probe* probe = ::io_uring_get_probe_ring(&ring_);
      if (probe == nullptr) throwError(ENOSYS, "io_uring probe");
      const bool supported = ::io_uring_opcode_supported(probe, IORING_OP_POLL_ADD) &&
                             ::io_uring_opcode_supported(probe, IORING_OP_POLL_REMOVE);
      ::io_uring_free_probe(probe);
      if (!supported) throwError(ENOSYS, "io_uring lacks POLL_ADD/POLL_REMOVE");
      // A forked child (a test, a helper) must not share our submission queue.
      const int dontfork = ::io_uring_ring_dontfork(&ring_);
      if (dontfork < 0) throwError(-dontfork, "io_uring_ring_dontfork");
      wake_ = makeEventFd();
      addWatch(wake_.get(), kReservedToken);
    } catch (...) {
      ::io_uring_queue_exit(&ring_);
      throw;
    }
  }

  ~IoUringPoller() override { ::io_uring_queue_exit(&ring_); }

  // gpuproxy::ipc::Poller
  void add(int fd, std::uint64_t token) override {
    checkToken(token);
    addWatch(fd, token);
  }

  void remove(int fd) override {
    const auto found = watches_.find(fd);
    if (found == watches_.end())
      throwError(ENOENT, "Poller::remove(fd " + std::to_string(fd) + ")");
    if (found->second.armed) {
      // Cancel now rather than at the next wait(): the poll holds a reference to the file, which
      // the caller is about to close.
      io_uring_sqe* sqe = sqeOrFlush();
      ::io_uring_prep_poll_remove(sqe, userData(fd, found->second.generation));
      ::io_uring_sqe_set_data64(sqe, kIgnoredUserData);
      ::io_uring_submit(&ring_);
    }
    watches_.erase(found);
  }

  void wait(std::vector<std::uint64_t>& ready, std::chrono::nanoseconds timeout) override {
    ready.clear();
    for (auto& [fd, watch] : watches_) {
      if (watch.armed) continue;
      io_uring_sqe* sqe = sqeOrFlush();
      ::io_uring_prep_poll_add(sqe, fd, POLLIN);
      ::io_uring_sqe_set_data64(sqe, userData(fd, watch.generation));
      watch.armed = true;
    }
    const Deadline deadline(timeout);
    for (;;) {
      const std::chrono::nanoseconds left = deadline.left();
      __kernel_timespec limit{};
      limit.tv_sec = left.count() / 1'000'000'000;
      limit.tv_nsec = left.count() % 1'000'000'000;
      io_uring_cqe* cqe = nullptr;
      const int result = ::io_uring_submit_and_wait_timeout(
          &ring_, &cqe, 1, left.count() < 0 ? nullptr : &limit, nullptr);
      if (result != -EINTR) {
        // ETIME: timed out. EAGAIN/EBUSY: completions are pending; harvest them below.
        if (result < 0 && result != -ETIME && result != -EAGAIN && result != -EBUSY) {
          throwError(-result, "io_uring_submit_and_wait_timeout");
        }
        break;
      }
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      complete(::io_uring_cqe_get_data64(cqe), cqe->res, ready);
    }
    ::io_uring_cq_advance(&ring_, seen);
  }

  void wake() noexcept override { signalEventFd(wake_.get()); }

  int readinessFd() const noexcept override { return ring_.ring_fd; }

  std::string_view backendName() const noexcept override { return "io_uring"; }

private:
  static constexpr unsigned kEntries = 256;
  static constexpr std::uint64_t kIgnoredUserData = ~std::uint64_t{0};

  struct Watch {
    std::uint64_t token;
    std::uint32_t generation;
    bool armed;
  };

  static std::uint64_t userData(int fd, std::uint32_t generation) {
    return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
  }

  void addWatch(int fd, std::uint64_t token) {
    if (fd < 0) throwError(EBADF, "Poller::add(fd " + std::to_string(fd) + ")");
    // epoll would refuse a descriptor that is not open; so do we, rather than report it later.
    if (::fcntl(fd, F_GETFD) < 0) throwError(errno, "Poller::add(fd " + std::to_string(fd) + ")");
    if (watches_.count(fd) != 0) {
      throwError(EEXIST, "Poller::add(fd " + std::to_string(fd) + ")");
    }
    // Generation 0 is never used, so that kIgnoredUserData (generation ~0) cannot collide with
    // a live watch before 2^32 registrations.
    if (++generation_ == 0) ++generation_;
    watches_.emplace(fd, Watch{token, generation_, false});
  }

  void complete(std::uint64_t data, int result, std::vector<std::uint64_t>& ready) {
    if (data == kIgnoredUserData) return;
    const int fd = static_cast<int>(static_cast<std::uint32_t>(data));
    const auto found = watches_.find(fd);
    if (found == watches_.end() || found->second.generation != data >> 32) return;  // removed
    Watch& watch = found->second;
    watch.armed = false;
    // Cancelled polls are simply re-armed. Any other error (a descriptor closed without
    // remove()) is reported as readiness, so that its owner's read fails and it notices, rather
    // than the descriptor going quiet.
    if (result == -ECANCELED) return;
    if (watch.token == kReservedToken) {
      drainEventFd(wake_.get());
      return;
    }
    ready.push_back(watch.token);
  }

  io_uring_sqe* sqeOrFlush() {
    io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      ::io_uring_submit(&ring_);
      sqe = ::io_uring_get_sqe(&ring_);
      if (sqe == nullptr) throwError(EBUSY, "io_uring submission queue full");
    }
    return sqe;
  }

  io_uring ring_{};
  UniqueFd wake_;
  std::unordered_map<int, Watch> watches_;
  std::uint32_t generation_ = 0;
};

}  // namespace

std::unique_ptr<Poller> newEpollPoller() {
  return std::make_unique<EpollPoller>();
}

std::unique_ptr<Poller> newIoUringPoller() {
  return std::make_unique<IoUringPoller>();
}

std::unique_ptr<Poller> newPoller(PollerBackend backend,
                                  const std::function<void(std::string_view)>& log) {
  switch (backend) {
    case PollerBackend::kIoUring:
      return newIoUringPoller();
    case PollerBackend::kEpoll:
      return newEpollPoller();
    case PollerBackend::kAuto:
      break;
  }
  try {
    auto poller = newIoUringPoller();
    if (log) log("ipc poller: io_uring");
    return poller;
  } catch (const std::system_error& error) {
    if (log) log(std::string("ipc poller: epoll (io_uring unavailable: ") + error.what() + ")");
    return newEpollPoller();
  }
}

}  // namespace gpuproxy::ipc
