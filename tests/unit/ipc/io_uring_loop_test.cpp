#include "ipc/io_uring_loop.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/doorbell.hpp"
#include "tests/unit/ipc/forked_child.hpp"

namespace gpuproxy::ipc {
namespace {

using namespace std::chrono_literals;

struct Backend {
  const char* name;
  std::unique_ptr<Poller> (*make)();
};

class PollerTest : public ::testing::TestWithParam<Backend> {
protected:
  void SetUp() override {
    try {
      poller_ = GetParam().make();
    } catch (const std::system_error& error) {
      // Only io_uring may be missing (seccomp, old kernel); epoll always exists.
      if (std::string(GetParam().name) == "io_uring") GTEST_SKIP() << error.what();
      throw;
    }
  }

  std::vector<std::uint64_t> waitFor(std::chrono::nanoseconds timeout) {
    std::vector<std::uint64_t> ready;
    poller_->wait(ready, timeout);
    std::sort(ready.begin(), ready.end());
    return ready;
  }

  static void signal(const UniqueFd& fd) {
    const std::uint64_t one = 1;
    ASSERT_EQ(::write(fd.get(), &one, sizeof(one)), 8);
  }

  std::unique_ptr<Poller> poller_;
};

TEST_P(PollerTest, NamesItsBackend) {
  EXPECT_EQ(poller_->backendName(), GetParam().name);
}

TEST_P(PollerTest, ReportsReadableDescriptorsByToken) {
  UniqueFd a = makeEventFd();
  UniqueFd b = makeEventFd();
  UniqueFd c = makeEventFd();
  poller_->add(a.get(), 1);
  poller_->add(b.get(), 2);
  poller_->add(c.get(), 3);
  EXPECT_TRUE(waitFor(0ns).empty());
  signal(a);
  signal(c);
  EXPECT_EQ(waitFor(1s), (std::vector<std::uint64_t>{1, 3}));
}

// The daemon sleeps on readinessFd() inside its own event loop; a doorbell must make it readable.
TEST_P(PollerTest, ReadinessDescriptorBecomesReadableWhenSomethingIsReady) {
  UniqueFd a = makeEventFd();
  poller_->add(a.get(), 7);
  EXPECT_TRUE(waitFor(0ns).empty());  // arms the watches
  pollfd readiness{poller_->readinessFd(), POLLIN, 0};
  EXPECT_EQ(::poll(&readiness, 1, 0), 0);
  std::thread later([&] {
    std::this_thread::sleep_for(20ms);
    signal(a);
  });
  EXPECT_EQ(::poll(&readiness, 1, 5000), 1);
  later.join();
  EXPECT_EQ(waitFor(0ns), (std::vector<std::uint64_t>{7}));
}

TEST_P(PollerTest, IsLevelTriggered) {
  UniqueFd a = makeEventFd();
  poller_->add(a.get(), 7);
  signal(a);
  EXPECT_EQ(waitFor(1s), std::vector<std::uint64_t>{7});
  EXPECT_EQ(waitFor(1s), std::vector<std::uint64_t>{7}) << "still readable, so reported again";
  drainEventFd(a.get());
  EXPECT_TRUE(waitFor(10ms).empty());
  signal(a);
  EXPECT_EQ(waitFor(1s), std::vector<std::uint64_t>{7});
}

TEST_P(PollerTest, TimesOutWhenNothingIsReady) {
  UniqueFd a = makeEventFd();
  poller_->add(a.get(), 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(waitFor(30ms).empty());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 29ms);
  EXPECT_LT(elapsed, 2s);
}

TEST_P(PollerTest, WakesUpAnotherThreadsWait) {
  UniqueFd a = makeEventFd();
  poller_->add(a.get(), 1);
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    poller_->wake();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(waitFor(-1ns).empty());  // no timeout: only wake() ends it
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  waker.join();
  // The wake is consumed: the next wait times out normally.
  EXPECT_TRUE(waitFor(5ms).empty());
}

TEST_P(PollerTest, WakeBeforeWaitIsNotLost) {
  poller_->wake();
  EXPECT_TRUE(waitFor(-1ns).empty());
}

TEST_P(PollerTest, RemovedDescriptorsAreNotReported) {
  UniqueFd a = makeEventFd();
  UniqueFd b = makeEventFd();
  poller_->add(a.get(), 1);
  poller_->add(b.get(), 2);
  EXPECT_TRUE(waitFor(0ns).empty());  // both armed
  poller_->remove(a.get());
  signal(a);
  signal(b);
  EXPECT_EQ(waitFor(1s), std::vector<std::uint64_t>{2});
  EXPECT_THROW(poller_->remove(a.get()), std::system_error);
  // Re-adding the same descriptor with a new token works, and stale completions of the old
  // registration do not leak through.
  poller_->add(a.get(), 11);
  EXPECT_EQ(waitFor(1s), (std::vector<std::uint64_t>{2, 11}));
}

TEST_P(PollerTest, RefusesDuplicatesReservedTokensAndBadDescriptors) {
  UniqueFd a = makeEventFd();
  poller_->add(a.get(), 1);
  EXPECT_THROW(poller_->add(a.get(), 2), std::system_error);
  UniqueFd b = makeEventFd();
  EXPECT_THROW(poller_->add(b.get(), Poller::kReservedToken), std::system_error);
  EXPECT_THROW(poller_->add(-1, 3), std::system_error);
}

TEST_P(PollerTest, PidfdReportsChildExit) {
  test::ForkedChild child([] {
    std::this_thread::sleep_for(20ms);
    return 0;
  });
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child.pid(), 0));
  if (pidfd < 0) GTEST_SKIP() << "pidfd_open unavailable";
  UniqueFd owned(pidfd);
  poller_->add(owned.get(), 5);
  EXPECT_EQ(waitFor(10s), std::vector<std::uint64_t>{5});
  EXPECT_EQ(child.wait(), 0);
}

TEST_P(PollerTest, ManyDescriptors) {
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 600; ++i) {  // more than the io_uring's submission queue holds at once
    fds.push_back(makeEventFd());
    poller_->add(fds.back().get(), static_cast<std::uint64_t>(i));
  }
  EXPECT_TRUE(waitFor(0ns).empty());
  for (int i = 0; i < 600; i += 3) signal(fds[static_cast<std::size_t>(i)]);
  std::vector<std::uint64_t> seen;
  for (int round = 0; round < 10 && seen.size() < 200; ++round) {
    for (std::uint64_t token : waitFor(1s)) seen.push_back(token);
    for (std::uint64_t token : seen) drainEventFd(fds[token].get());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  }
  ASSERT_EQ(seen.size(), 200u);
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i * 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, PollerTest,
                         ::testing::Values(Backend{"io_uring", &newIoUringPoller},
                                           Backend{"epoll", &newEpollPoller}),
                         [](const auto& info) {
                           return std::string(info.param.name) == "io_uring" ? "IoUring" : "Epoll";
                         });

TEST(NewPoller, AutoPicksABackendAndSaysWhich) {
  std::vector<std::string> lines;
  auto poller =
      newPoller(PollerBackend::kAuto, [&](std::string_view line) { lines.emplace_back(line); });
  ASSERT_NE(poller, nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(poller->backendName()), std::string::npos) << lines[0];
}

TEST(NewPoller, ExplicitEpoll) {
  EXPECT_EQ(newPoller(PollerBackend::kEpoll)->backendName(), "epoll");
}

}  // namespace
}  // namespace gpuproxy::ipc
