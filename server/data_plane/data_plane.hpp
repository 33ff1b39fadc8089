#pragma once
// A data-plane loop: it serves the command rings it is given from the thread that runs it. In
// the daemon each GPU's thread (GpuThread) runs one over every client's ring for that GPU, so a
// ring's commands are executed on the thread that owns the GPU's state, with no locks and no
// hand-off; the main thread runs one for what is not a GPU's ring (pidfds, below).
//
// While any ring has had work within the spin window the loop polls all rings on every turn of
// the event loop (yielding to control-plane events in between), so a busy client's commands are
// picked up within a turn and its launches cost it no syscall. Once every ring has been idle for
// the spin window, the loop announces sleep in each ring, re-checks them, and sleeps on the
// doorbell eventfds through an ipc::Poller (io_uring where the kernel allows it, else epoll),
// whose readiness descriptor the kj event loop watches together with its sockets.
//
// The same poller watches the pidfds of client processes (whenReadable), so a client's death is
// noticed through the io_uring loop as well as by its socket hanging up.

#include "ipc/io_uring_loop.hpp"
#include "server/data_plane/client_channel.hpp"

#include <kj/async-unix.h>
#include <kj/async.h>
#include <kj/timer.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

namespace gpuproxy::server {

// The busy-poll interval (kj::WaitScope::setBusyPollInterval) of a thread whose loop runs a
// DataPlane: the loop keeps the event queue non-empty while it spins, so the thread looks at its
// port (sockets, signals, messages from other threads) every this many turns anyway, and control
// calls are not starved by a busy client.
inline constexpr unsigned kDataPlaneBusyPollInterval = 4;

struct DataPlaneOptions {
  ipc::PollerBackend poller = ipc::PollerBackend::kAuto;
  // How long the loop keeps polling after the last command before it sleeps.
  std::chrono::microseconds spinWindow{50};
  // How often a client whose queued work is at its bound (ClientStats::queueFull), or whose
  // answers wait for room in its completion ring, is looked at again while the loop sleeps: its
  // commands (or answers) wait meanwhile, and the loop does not spin for it.
  std::chrono::microseconds throttledRecheck{1000};
};

class DataPlane {
public:
  // `port` and `timer` are those of the thread that runs the loop.
  DataPlane(kj::UnixEventPort& port, kj::Timer& timer, DataPlaneOptions options = {});
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Serves `channel` until remove(); borrowed.
  void add(ClientChannel& channel);
  void remove(ClientChannel& channel);

  // Resolves once `fd` is readable (for a pidfd: the process has exited). `fd` is borrowed and must
  // stay open until the promise resolves or is dropped.
  kj::Promise<void> whenReadable(int fd);

  // The loop; never resolves. Run it eagerly on the thread that owns `port`.
  kj::Promise<void> run();

  // Resolves after throttledRecheck: when a client at its queued-work bound may have room again
  // (for work that reaches the daemon other than through a ring: Session.submit).
  kj::Promise<void> afterThrottledRecheck() {
    return timer_.afterDelay(options_.throttledRecheck.count() * kj::MICROSECONDS);
  }

  std::string_view pollerName() const { return poller_->backendName(); }
  std::size_t channelCount() const { return channels_.size(); }

private:
  // One pass over every ring; whether any command was executed.
  bool pumpAll();
  kj::Promise<void> spin();
  kj::Promise<void> sleep();
  // Harvests the poller without blocking (which also re-arms io_uring polls) and acts on it:
  // fulfils fd watches, and says whether a doorbell rang.
  bool harvest();
  // Runs forever: whenever the poller's descriptor turns readable, harvests it.
  kj::Promise<void> watchPoller();

  struct FdWatch {
    int fd;
    kj::Own<kj::PromiseFulfiller<void>> fulfiller;
  };

  std::unique_ptr<ipc::Poller> poller_;
  kj::UnixEventPort::FdObserver observer_;
  kj::Timer& timer_;
  DataPlaneOptions options_;
  std::map<std::uint64_t, ClientChannel*> channels_;  // by poller token
  std::map<ClientChannel*, std::uint64_t> tokens_;
  std::uint64_t nextToken_ = 1;
  std::chrono::steady_clock::time_point lastWork_{};
  std::map<std::uint64_t, FdWatch> fdWatches_;  // by poller token
  std::vector<std::uint64_t> ready_;
  // Fulfilled when a doorbell rings while the loop sleeps.
  kj::Own<kj::PromiseFulfiller<void>> wakeLoop_;
  kj::Promise<void> pollerWatch_ = nullptr;
};

}  // namespace gpuproxy::server
