// The data plane of one session: handing the client its segment, and acting on each command it
// puts in its ring (protocol/RING_FORMAT.md). Every command goes through the same checks and the
// same GpuClient operations as the control call that does the same thing; only the way the
// answer travels differs: an asynchronous command that fails becomes an AsyncError the stub
// reports at the next synchronising call, a waited-for command answers its completion token.

#include "protocol/overloaded.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/session/client_session.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>
#include <type_traits>

namespace gpuproxy::server {

namespace ring = protocol::ring;

namespace {

// Queued kernels and staged copies per client before its ring stops being read. Enough to keep a
// GPU busy through any launch burst; small enough that staged bytes (a few MiB each at most)
// cannot grow the daemon without bound.
constexpr std::int64_t kMaxOperationsInFlight = 4096;

// The largest pinned heap a client gets: address space and (once touched) memory of the daemon's
// mapping too, so bounded whatever the client asks for. The tenant's pinned_memory_limit bounds
// what it can actually pin.
constexpr std::uint64_t kMaxPinnedHeapBytes = std::uint64_t{1} << 30;

// A capability whose only content is a file descriptor (protocol::SharedFile). It owns its own
// duplicate, so it may outlive the session while Cap'n Proto is still sending it.
class SharedFileServer final : public protocol::SharedFile::Server {
public:
  explicit SharedFileServer(int fd) : fd_(::fcntl(fd, F_DUPFD_CLOEXEC, 0)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "dup");
  }
  ~SharedFileServer() { ::close(fd_); }
  SharedFileServer(const SharedFileServer&) = delete;
  SharedFileServer& operator=(const SharedFileServer&) = delete;

  kj::Maybe<int> getFd() override { return fd_; }

private:
  int fd_;
};

backend::LaunchConfig configOf(const ring::LaunchKernel& launch) {
  return backend::LaunchConfig{backend::Dim3{launch.grid.x, launch.grid.y, launch.grid.z},
                               backend::Dim3{launch.block.x, launch.block.y, launch.block.z},
                               launch.sharedMemBytes};
}

}  // namespace

ClientSession::DispatchCallResult ClientSession::dispatchCall(
    std::uint64_t interfaceId, std::uint16_t methodId,
    capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
  if (channel_) channel_->pumpAll();
  return protocol::Session::Server::dispatchCall(interfaceId, methodId, context);
}

kj::Promise<void> ClientSession::openDataPlane(OpenDataPlaneContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  if (channel_) {
    results.setResult(CUDA_ERROR_ALREADY_MAPPED);
    return kj::READY_NOW;
  }
  if (state_.dataPlane == nullptr) {
    results.setResult(CUDA_ERROR_NOT_SUPPORTED);
    return kj::READY_NOW;
  }
  ChannelSizes sizes;
  std::optional<ipc::AddressReservation> reservation;
  try {
    if (params.getAddress() != 0) {
      const std::uint64_t page = ipc::pageSize();
      sizes.pinnedHeapBytes =
          (std::min(params.getPinnedHeapBytes(), kMaxPinnedHeapBytes) + page - 1) / page * page;
      const std::uint64_t needed = ClientChannel::segmentBytesFor(sizes);
      results.setSegmentBytes(needed);
      if (params.getAddress() % page != 0 || needed > params.getReservedBytes()) {
        results.setResult(CUDA_ERROR_INVALID_VALUE);
        return kj::READY_NOW;
      }
      try {
        reservation = ipc::AddressReservation::reserveAt(
            reinterpret_cast<void*>(static_cast<std::uintptr_t>(params.getAddress())), needed);
      } catch (const std::system_error& error) {
        // Taken here (or not a usable address at all): the client tries another one.
        spdlog::debug("pid {}: cannot map its data plane at {:#x}: {}", stats_->identity.pid,
                      params.getAddress(), error.what());
        results.setResult(CUDA_ERROR_ALREADY_MAPPED);
        return kj::READY_NOW;
      }
    }
    auto channel =
        std::make_unique<ClientChannel>(static_cast<CommandExecutor&>(*this),
                                        "gpuproxy-client-" + std::to_string(stats_->identity.pid),
                                        sizes, reservation ? &*reservation : nullptr);
    results.setSegment(kj::heap<SharedFileServer>(channel->segmentFd()));
    results.setDoorbell(kj::heap<SharedFileServer>(channel->doorbellFd()));
    results.setSegmentBytes(channel->segmentBytes());
    results.setPinnedHeapBytes(channel->pinnedHeap().size());
    state_.dataPlane->add(*channel);
    channel_ = std::move(channel);
    results.setResult(CUDA_SUCCESS);
  } catch (const std::exception& error) {
    spdlog::warn("pid {}: cannot set up its data plane: {}", stats_->identity.pid, error.what());
    results.setResult(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return kj::READY_NOW;
}

bool ClientSession::readyForCommands() const {
  return stats_->operationsInFlight.load(std::memory_order_relaxed) < kMaxOperationsInFlight;
}

void ClientSession::taskFailed(kj::Exception&& exception) {
  spdlog::warn("pid {}: ring command failed: {}", stats_->identity.pid,
               exception.getDescription().cStr());
}

void ClientSession::evict(const std::string& reason) {
  spdlog::warn("pid {} ({}) broke the data-plane format ({}): disconnecting it",
               stats_->identity.pid, stats_->identity.command, reason);
  channel_->markBroken(reason);
  state_.connections.endConnection(connectionId_);
}

void ClientSession::execute(const ring::DecodedCommand& command, ClientChannel& channel) {
  // Reports the outcome of an asynchronous command: nothing on success, an AsyncError otherwise.
  auto report = [&channel](CUresult result, const auto& command, ring::Opcode opcode) {
    if (result == CUDA_SUCCESS) return;
    channel.postAsyncError(ring::AsyncError{command.sequence, command.context, command.stream,
                                            result, static_cast<std::uint16_t>(opcode)});
  };
  // Answers a waited-for command now (a token) or reports its failure (no token).
  auto answer = [&](CUresult result, std::uint64_t token, const auto& command,
                    ring::Opcode opcode) {
    if (token != 0) {
      channel.postCompletion(token, result);
    } else {
      report(result, command, opcode);
    }
  };
  // answer() once `promise` resolves (work that reads or writes the client's segment).
  auto answerWhenDone = [&](kj::Promise<CUresult> promise, std::uint64_t token, const auto& command,
                            ring::Opcode opcode) {
    ring::AsyncError failure{command.sequence, command.context, command.stream, CUDA_SUCCESS,
                             static_cast<std::uint16_t>(opcode)};
    ringTasks_->add(promise.then([&channel, token, failure](CUresult result) mutable {
      if (token != 0) {
        channel.postCompletion(token, result);
      } else if (result != CUDA_SUCCESS) {
        failure.result = result;
        channel.postAsyncError(failure);
      }
    }));
  };
  // Answers `token` once `promise` resolves.
  auto answerLater = [&](kj::Promise<CUresult> promise, std::uint64_t token) {
    ringTasks_->add(promise.then(
        [&channel, token](CUresult result) { channel.postCompletion(token, result); }));
  };

  std::visit(
      protocol::Overloaded{
          [&](const ring::LaunchKernel& launch) {
            std::span<const std::byte> parameters = launch.inlineParameters;
            std::vector<std::byte> copied;
            if (launch.parameterReference) {
              auto bytes = channel.hostBytes(*launch.parameterReference, launch.parameterBytes);
              copied.assign(bytes.begin(), bytes.end());
              parameters = copied;
              if (launch.parameterReference->region == ring::HostRegion::kStaging) {
                channel.postStagingRelease(launch.parameterReference->offset,
                                           launch.parameterBytes);
              }
            }
            report(launchKernel(launch.context, launch.function, configOf(launch), launch.stream,
                                parameters),
                   launch, ring::Opcode::kLaunchKernel);
          },
          [&](const ring::CopyHostToDevice& copy) {
            GpuClient* client = clientFor(copy.context, HandleKind::kContext);
            if (copy.source.region == ring::HostRegion::kPinnedHeap && client != nullptr) {
              // DMA straight from the application's pinned buffer, which the segment's keep-alive
              // keeps mapped until the copy is over; answered when it is.
              answerWhenDone(
                  client->copyHostToDeviceFrom(copy.context, copy.stream, copy.destination,
                                               channel.hostBytes(copy.source, copy.bytes),
                                               channel.segmentKeepAlive()),
                  copy.completionToken, copy, ring::Opcode::kCopyHostToDevice);
              return;
            }
            CUresult result = CUDA_ERROR_INVALID_CONTEXT;
            kj::Promise<CUresult> read = nullptr;
            if (client != nullptr) {
              // Straight from the staging range too: moving the client's bytes into a buffer of
              // the daemon's own would be done on this thread, the event loop every client and
              // every death notice waits on. The range goes back to the client once the backend
              // has read it; the caller's own buffer was free again once the stub had filled the
              // range, so a waiting caller is answered now (CUDA's pageable semantics).
              result = client->queueHostToDeviceFrom(copy.context, copy.stream, copy.destination,
                                                     channel.hostBytes(copy.source, copy.bytes),
                                                     channel.segmentKeepAlive(), read);
            }
            if (copy.source.region == ring::HostRegion::kStaging) {
              const std::uint64_t offset = copy.source.offset;
              const std::uint64_t bytes = copy.bytes;
              if (result == CUDA_SUCCESS) {
                ringTasks_->add(read.then([&channel, offset, bytes](CUresult) {
                  channel.postStagingRelease(offset, bytes);
                }));
              } else {
                channel.postStagingRelease(offset, bytes);
              }
            }
            answer(result, copy.completionToken, copy, ring::Opcode::kCopyHostToDevice);
          },
          [&](const ring::CopyDeviceToHost& copy) {
            GpuClient* client = clientFor(copy.context, HandleKind::kContext);
            if (client == nullptr) {
              answer(CUDA_ERROR_INVALID_CONTEXT, copy.completionToken, copy,
                     ring::Opcode::kCopyDeviceToHost);
              return;
            }
            // Straight into the client's staging area: no copy in the daemon.
            answerWhenDone(
                client->copyDeviceToHostInto(copy.context, copy.stream, copy.source,
                                             channel.hostBytes(copy.destination, copy.bytes),
                                             channel.segmentKeepAlive()),
                copy.completionToken, copy, ring::Opcode::kCopyDeviceToHost);
          },
          [&](const ring::CopyDeviceToDevice& copy) {
            GpuClient* client = clientFor(copy.context, HandleKind::kContext);
            report(client == nullptr
                       ? CUDA_ERROR_INVALID_CONTEXT
                       : client->enqueue(copy.context, copy.stream,
                                         backend::CopyDeviceToDevice{copy.destination, copy.source,
                                                                     copy.bytes}),
                   copy, ring::Opcode::kCopyDeviceToDevice);
          },
          [&](const ring::Memset& memset) {
            GpuClient* client = clientFor(memset.context, HandleKind::kContext);
            report(client == nullptr
                       ? CUDA_ERROR_INVALID_CONTEXT
                       : client->enqueue(memset.context, memset.stream,
                                         backend::Memset{memset.destination, memset.value,
                                                         memset.elementSize, memset.count}),
                   memset, ring::Opcode::kMemset);
          },
          [&](const ring::EventRecord& record) {
            GpuClient* client = clientFor(record.event, HandleKind::kEvent);
            report(client == nullptr
                       ? CUDA_ERROR_INVALID_HANDLE
                       : client->recordEvent(record.context, record.event, record.stream),
                   record, ring::Opcode::kEventRecord);
          },
          [&](const ring::StreamWaitEvent& wait) {
            report(streamWaitEvent(wait.context, wait.stream, wait.event, wait.flags), wait,
                   ring::Opcode::kStreamWaitEvent);
          },
          [&](const ring::Synchronize& sync) {
            const std::uint64_t token = sync.completionToken;
            switch (sync.kind) {
              case ring::SynchronizeKind::kStream: {
                CUresult missing;
                GpuClient* client = clientForStream(sync.context, sync.handle, missing);
                if (client == nullptr) {
                  channel.postCompletion(token, missing);
                } else if (sync.query) {
                  channel.postCompletion(token, client->queryStream(sync.context, sync.handle));
                } else {
                  answerLater(client->synchronizeStream(sync.context, sync.handle), token);
                }
                return;
              }
              case ring::SynchronizeKind::kEvent: {
                GpuClient* client = clientFor(sync.handle, HandleKind::kEvent);
                if (client == nullptr) {
                  channel.postCompletion(token, CUDA_ERROR_INVALID_HANDLE);
                } else if (sync.query) {
                  channel.postCompletion(token, client->queryEvent(sync.handle));
                } else {
                  answerLater(client->synchronizeEvent(sync.handle), token);
                }
                return;
              }
              case ring::SynchronizeKind::kContext: {
                GpuClient* client = clientFor(sync.context, HandleKind::kContext);
                if (client == nullptr) {
                  channel.postCompletion(token, CUDA_ERROR_INVALID_CONTEXT);
                } else if (sync.query) {
                  channel.postCompletion(token, CUDA_ERROR_NOT_SUPPORTED);
                } else {
                  answerLater(client->synchronizeContext(sync.context), token);
                }
                return;
              }
            }
            channel.postCompletion(token, CUDA_ERROR_INVALID_VALUE);
          },
          [&](const ring::DecodeError& error) {
            if (error.disconnect) {
              evict(std::string(ring::describe(error.failure)));
            } else if (error.completionToken != 0) {
              channel.postCompletion(error.completionToken, error.result);
            } else {
              channel.postAsyncError(ring::AsyncError{error.sequence, error.context, error.stream,
                                                      error.result, error.opcode});
            }
          },
      },
      command);
}

}  // namespace gpuproxy::server
