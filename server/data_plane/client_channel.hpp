#pragma once
// One ring pair of a client's data plane (protocol/RING_FORMAT.md): the command ring of one of
// its GPUs, which the client writes, the completion ring that answers it, which the daemon
// writes, and the eventfd the client rings when the daemon sleeps. The segment that holds them
// (ClientSegment) is shared with the client's other ring pairs.
//
// The channel moves bytes and knows nothing of CUDA: it copies each command out of the ring,
// decodes and validates it, and hands the decoded command to its CommandExecutor (the GPU's),
// which checks handles and pointers against the client's own tables and acts. What the executor
// answers goes back through post*(). Nothing here blocks on anything the client controls: a full
// completion ring parks answers in the daemon's own queue, and while that queue is long the
// channel stops taking commands, so a client that never reads its answers throttles itself only.
// One thread serves a channel (the one that runs its data-plane loop); channels of one segment
// may be served by different threads.

#include "ipc/doorbell.hpp"
#include "ipc/spsc_ring.hpp"
#include "ipc/unique_fd.hpp"
#include "protocol/ring_format.hpp"
#include "server/data_plane/client_segment.hpp"
#include "server/data_plane/command_port.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace gpuproxy::server {

class ClientChannel final : public CommandPort {
public:
  // Serves ring pair `ring` of `segment` (< segment->ringPairs()). Throws std::system_error when
  // the kernel refuses the eventfd.
  ClientChannel(CommandExecutor& executor, std::shared_ptr<ClientSegment> segment,
                std::uint32_t ring);
  ~ClientChannel() override;
  ClientChannel(const ClientChannel&) = delete;
  ClientChannel& operator=(const ClientChannel&) = delete;

  // What the client is handed (borrowed; the channel keeps owning it).
  int doorbellFd() const { return doorbell_.get(); }

  // Executes up to `budget` commands that the client has published; returns how many. Stops early
  // when the channel is broken or too many answers wait for room in the completion ring.
  std::size_t pump(std::size_t budget);
  // Executes every command published so far (the session has this done before each control call
  // that finds drained() false, so a client's calls keep their order across the two paths).
  void pumpAll();
  // Whether every command the client had published when this was called has been executed, as
  // far as the thread serving the channel has said. Safe from any thread: a control call that
  // finds it true needs no message to that thread first (what the records did happened there
  // before it said so, and so before any later message is run there).
  bool drained() const {
    return commands_->publishedIndex() == executedThrough_.load(std::memory_order_acquire);
  }
  // Whether a command waits in the ring that may be executed now: the loop must not sleep. Moves
  // answers that waited for room into the completion ring first, if there is room now.
  bool hasWork();
  // Whether commands wait in the ring that the executor does not take yet (the client is at its
  // bound on queued work): the loop sleeps, but looks again soon.
  bool throttled();
  // Whether answers wait for room in the completion ring. The client makes room by reading it,
  // which rings no doorbell, so the loop sleeps but looks again soon, as for throttled().
  bool answersWaiting() const { return !parked_.empty(); }
  // Called when an answer has to wait for room (set by the data-plane loop, which may be asleep:
  // an answer posted by work that finished later finds the ring full with nobody looking).
  void onAnswersWaiting(std::function<void()> wake) { answersWaiting_ = std::move(wake); }

  // The doorbell handshake around the data-plane loop's sleep (ipc/doorbell.hpp).
  void prepareToSleep() { waiter_->prepareToSleep(); }
  void finishSleep() { waiter_->finishSleep(); }

  // CommandPort: answers go into this pair's completion ring; host bytes are the segment's
  // staging area and pinned heap, kept mapped by keepAlive() (the segment) even after the channel
  // is gone.
  void postCompletion(std::uint64_t token, CUresult result) override;
  void postAsyncError(const protocol::ring::AsyncError& error) override;
  void postStagingRelease(std::uint64_t offset, std::uint64_t bytes) override;
  void postDeviceOutput(std::uint64_t bytes) override;
  std::span<std::byte> hostBytes(const protocol::ring::HostLocation& location,
                                 std::uint64_t bytes) override;
  std::shared_ptr<const void> keepAlive() override { return segment_; }

  // The executor is going (its session ends): the channel executes nothing more and tells nobody
  // when it breaks, while answers still posted to it go into the completion ring as ever.
  void detachExecutor() { executor_ = nullptr; }

  // A framing error: the client broke the format. The channel stops reading, keeps the reason and
  // tells its executor (once).
  void markBroken(std::string reason);
  bool broken() const { return broken_.has_value(); }

  std::uint64_t commandsExecuted() const { return commandsExecuted_; }

private:
  using Answer = std::variant<protocol::ring::Completion, protocol::ring::AsyncError,
                              protocol::ring::StagingRelease, protocol::ring::DeviceOutput>;
  void post(Answer answer);
  // Moves parked answers into the completion ring while there is room; wakes the client once.
  void flushAnswers();

  CommandExecutor* executor_;  // null once detached
  std::shared_ptr<ClientSegment> segment_;
  ipc::UniqueFd doorbell_;
  std::optional<ipc::RingReader> commands_;
  std::optional<ipc::RingWriter> completions_;
  std::optional<ipc::DoorbellWaiter> waiter_;
  std::optional<ipc::CompletionPublisher> publisher_;
  std::deque<Answer> parked_;
  std::function<void()> answersWaiting_;
  std::vector<std::byte> record_;
  std::optional<std::string> broken_;
  std::uint64_t commandsExecuted_ = 0;
  // The command ring's read index once the commands read so far have been executed (drained()).
  std::atomic<std::uint64_t> executedThrough_{0};
};

}  // namespace gpuproxy::server
