#pragma once
// The executor of one client's command records (protocol/RING_FORMAT.md) on one GPU: what a
// record does with the client's state on that GPU (its GpuClient), and nothing else. A session
// has one per GPU it uses (ClientSession routes each record to the one of the GPU its handle
// names), so that everything a record touches, but for the two questions below, is one GPU's:
// this is the part of a session that runs on the GPU's own thread once each GPU has one, reading
// that GPU's command ring (docs/architecture.md §2, "Towards a thread of its own per GPU").
//
// What a record needs beyond its GPU it asks the session for (CommandsBeyondOneGpu): ending the
// connection of a client that broke the format, and telling another GPU that a stream it holds
// for this GPU's event may go on (a stream's wait for an event of another GPU is two records,
// HoldForEvent and LetGoAfterEvent, one for each GPU). The live pinned allocations and the
// client's counters (ClientStats) are readable from any thread.
//
// Threads: made, used and destroyed on the thread that owns its GPU. Its tasks (the answers of
// synchronisations and copies that finish later) die with it, before its GpuClient.

#include "protocol/ring_format.hpp"
#include "server/data_plane/command_port.hpp"
#include "server/gpu/client_stats.hpp"
#include "server/gpu/gpu_client.hpp"
#include "server/gpu/handles.hpp"
#include "server/gpu/live_pinned_allocations.hpp"

#include <kj/async.h>
#include <kj/exception.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace gpuproxy::server {

// What a GPU's executor asks of the session it belongs to. (A record that breaks the format never
// reaches a GPU's executor: whoever frames the records, a ring's channel or Session.submit, ends
// the client's connection.)
class CommandsBeyondOneGpu {
public:
  virtual ~CommandsBeyondOneGpu() = default;
  // `letGo`'s event record is done (or there is none): the stream it names as the waiter, held
  // under its token, goes on (GpuCommandExecutor::letGoOfHold, by a message to the GPU its
  // HoldForEvent went to). Called on the session's thread (the executor sends it there), whose
  // tables say where that GPU's executor is.
  virtual void letGoElsewhere(const protocol::ring::LetGoAfterEvent& letGo) = 0;
};

class GpuCommandExecutor final : private kj::TaskSet::ErrorHandler {
public:
  // `client` is the client's state on this executor's GPU, borrowed, or null for the executor of
  // records that name no GPU the client uses (each is answered as the driver answers a handle it
  // does not know). `session` outlives every call of execute(); the executor's tasks, which may
  // outlive it, reach it only by a message to `sessionThread`, the thread it lives on, where it is
  // used only while `sessionAlive` holds true.
  GpuCommandExecutor(GpuClient* client, CommandsBeyondOneGpu& session,
                     kj::Own<const kj::Executor> sessionThread,
                     std::weak_ptr<const bool> sessionAlive, std::shared_ptr<ClientStats> stats,
                     std::shared_ptr<const LivePinnedAllocations> pinned);
  ~GpuCommandExecutor() noexcept;
  GpuCommandExecutor(const GpuCommandExecutor&) = delete;
  GpuCommandExecutor& operator=(const GpuCommandExecutor&) = delete;

  // The daemon device a record is for: the device of the handle its execution looks up first (a
  // stream's, else its context's; an event's for a record or synchronisation of one). nullopt for
  // a record that names none (a DecodeError, a null handle).
  static std::optional<std::uint32_t> deviceOf(const protocol::ring::DecodedCommand& command);

  // Acts on one decoded record and answers through `port` (at once, or from a task once the GPU
  // has done it). A record whose handles are not this GPU's is answered as an unknown handle.
  void execute(const protocol::ring::DecodedCommand& command, CommandPort& port);

  // Runs `work()` for `command`. What it throws is our bug, never the client's input (that is
  // answered with the driver's error before anything throws): the command fails with
  // CUDA_ERROR_UNKNOWN and is logged, and this client and every other go on.
  template <typename Work>
  void guarded(const protocol::ring::DecodedCommand& command, CommandPort& port, Work&& work) {
    try {
      work();
    } catch (const kj::Exception& error) {
      failInternally(command, port, error.getDescription().cStr());
    } catch (const std::exception& error) {
      failInternally(command, port, error.what());
    }
  }

  // A wait of a stream for an event of another GPU (cuStreamWaitEvent across GPUs) is two records,
  // one for each GPU (protocol/RING_FORMAT.md, HoldForEvent and LetGoAfterEvent):
  // - on the stream's GPU, holdForAnotherGpu holds the stream under `token` until
  //   letGoOfHold(token), which may come first, and then nothing is held;
  // - on the event's GPU, afterLatestRecord runs `then` on that GPU's thread once the latest
  //   record of `event` as of now is done (whether its work failed or not: that error is the
  //   other context's); `then` tells the stream's GPU, by a message through the session.
  // The stream's GPU learns nothing of the event but the token, and the event's GPU nothing of
  // the stream, so the two may run on two threads in either order.
  CUresult holdForAnotherGpu(Handle context, Handle stream, std::uint64_t token);
  void letGoOfHold(std::uint64_t token);
  // CUDA_ERROR_INVALID_HANDLE (and `then` never runs) when `event` is no event of this client's
  // on this GPU.
  CUresult afterLatestRecord(Handle event, kj::Function<void()> then);

private:
  void executeChecked(const protocol::ring::DecodedCommand& command, CommandPort& port);
  void failInternally(const protocol::ring::DecodedCommand& command, CommandPort& port,
                      const char* what);
  // kj::TaskSet::ErrorHandler
  void taskFailed(kj::Exception&& exception) override;

  // One record each.
  // A record that only touches device memory (a device-to-device copy, a memset).
  template <typename Command>
  void executeOnDevice(const Command& command, CommandPort& port);
  void executeLaunch(const protocol::ring::LaunchKernel& launch, CommandPort& port);
  void executeCopyToDevice(const protocol::ring::CopyHostToDevice& copy, CommandPort& port);
  void executeCopyToHost(const protocol::ring::CopyDeviceToHost& copy, CommandPort& port);
  void executeSynchronize(const protocol::ring::Synchronize& sync, CommandPort& port);
  void executeHostFunction(const protocol::ring::HostFunction& call, CommandPort& port);
  // The host function `token` names has returned: its stream, if held on this GPU, goes on.
  void openHostGate(std::uint64_t token);
  void executeLetGoAfterEvent(const protocol::ring::LetGoAfterEvent& letGo, CommandPort& port);
  void executeDecodeError(const protocol::ring::DecodeError& error, CommandPort& port);
  CUresult streamWaitEvent(const protocol::ring::StreamWaitEvent& wait);
  // Moves what the client's kernels printed on this GPU from the device to the GpuClient, and
  // tells the client through `port` if there is any (a synchronisation is about to be answered).
  void collectDeviceOutput(CommandPort& port);

  // The client's GpuClient when `handle` (of `kind`) is of this GPU; else null.
  GpuClient* clientFor(std::uint64_t handle, HandleKind kind) const;
  // The same for a record's stream (its context's for the null stream); `missing` is what to
  // answer when there is none.
  GpuClient* clientForStream(std::uint64_t context, std::uint64_t stream, CUresult& missing) const;

  GpuClient* client_;
  CommandsBeyondOneGpu& session_;
  kj::Own<const kj::Executor> sessionThread_;
  std::weak_ptr<const bool> sessionAlive_;
  std::shared_ptr<ClientStats> stats_;
  std::shared_ptr<const LivePinnedAllocations> pinned_;
  // Streams held for other GPUs' events: the session's token -> this GPU's name for the hold.
  std::map<std::uint64_t, std::uint64_t> heldForAnotherGpu_;
  // Tokens let go of before their hold came (the two halves ran in that order).
  std::set<std::uint64_t> letGoEarly_;
  kj::Own<kj::TaskSet> tasks_;
};

}  // namespace gpuproxy::server
