// Pinned host memory of one session: ranges of its data-plane segment's pinned heap that the
// client's allocator hands out (cuMemHostAlloc) and registers here. The daemon never reads the
// allocator's own bookkeeping, which lives in the same memory and which the client can scribble
// over; it keeps its own table of ranges, checks each new one against it, charges the tenant and
// registers the range with every GPU as device-mapped host memory. The segment is mapped at the
// same address in both processes, so the range's address here is the application's pointer.

#include "server/session/client_session.hpp"

#include "ipc/shared_segment.hpp"
#include "protocol/limits.hpp"
#include "server/gpu/gpu_messages.hpp"

#include <fcntl.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <system_error>

#include <utility>
#include <vector>

namespace gpuproxy::server {

namespace {

// Unregisters `host` from the GPUs in `gpus` (all of them had it registered), on their
// blocking-call threads; resolves once every one has.
kj::Promise<void> unregisterFromAll(const std::vector<GpuShard*>& gpus, void* host) {
  kj::Vector<kj::Promise<void>> unregistered;
  for (GpuShard* gpu : gpus) {
    unregistered.add(onGpu(*gpu, [host](GpuShard& gpu) {
                       return gpu.unregisterHostMemory(host);
                     }).then([index = gpu->index(), host](CUresult result) {
      if (result != CUDA_SUCCESS) {
        spdlog::warn("device {}: unregistering pinned host memory at {} failed: CUresult {}", index,
                     host, static_cast<int>(result));
      }
    }));
  }
  return kj::joinPromises(unregistered.releaseAsArray());
}

}  // namespace

bool ClientSession::chargePinned(std::uint64_t bytes) {
  Tenant& tenant = *stats_->tenant;
  if (tenant.tryChargePinned(bytes)) return true;
  spdlog::info("pid {}: {} bytes of pinned memory refused: tenant '{}' holds {} of its {}",
               stats_->identity.pid, bytes, tenant.name(), tenant.pinnedMemoryUsed(),
               tenant.limits().pinnedMemoryLimit.value_or(0));
  return false;
}

kj::Promise<CUresult> ClientSession::registerPinnedRange(std::uint64_t offset,
                                                         std::uint64_t bytes) {
  if (!segment_ || segment_->pinnedHeap().empty()) return CUDA_ERROR_NOT_SUPPORTED;
  const std::span<std::byte> heap = segment_->pinnedHeap();
  const std::uint64_t page = ipc::pageSize();
  if (bytes == 0 || offset % page != 0 || bytes % page != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset > heap.size() || bytes > heap.size() - offset) return CUDA_ERROR_INVALID_VALUE;
  if (pinned_->overlaps(offset, bytes) || overlapsAnyRange(retiring_, offset, bytes) ||
      overlapsAnyRange(registering_, offset, bytes)) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (!chargePinned(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* host = heap.data() + offset;
  registering_.emplace(offset, bytes);
  return pinForEveryGpu(host, bytes, segment_, [this, offset, bytes](bool registered) {
    registering_.erase(offset);
    if (registered) pinned_->add(offset, bytes);
  });
}

kj::Promise<CUresult> ClientSession::pinForEveryGpu(void* host, std::uint64_t bytes,
                                                    std::shared_ptr<const void> keepAlive,
                                                    kj::Function<void(bool)> settled) {
  std::vector<GpuShard*> gpus = services_.gpus;
  kj::Vector<kj::Promise<CUresult>> registrations;
  for (GpuShard* gpu : gpus) {
    registrations.add(onGpu(*gpu, [host, bytes, owner = stats_->addressSpace](GpuShard& gpu) {
      return gpu.registerHostMemory(host, bytes, owner);
    }));
  }
  // Pinning is done on each GPU's blocking-call thread. What follows must run even if the client
  // goes away meanwhile (the range is then unregistered and credited here, not by the teardown),
  // so it is the reaper's task, and the call is answered through a fulfiller.
  auto answer = kj::newPromiseAndFulfiller<CUresult>();
  services_.reaper.add(
      kj::joinPromises(registrations.releaseAsArray())
          .then([alive = std::weak_ptr<bool>(alive_), gpus = std::move(gpus), host, bytes,
                 stats = stats_, keepAlive = std::move(keepAlive), settled = kj::mv(settled),
                 fulfiller = kj::mv(answer.fulfiller)](kj::Array<CUresult> results) mutable {
            CUresult first = CUDA_SUCCESS;
            std::vector<GpuShard*> registered;
            for (std::size_t i = 0; i < results.size(); ++i) {
              if (results[i] == CUDA_SUCCESS) {
                registered.push_back(gpus[i]);
              } else if (first == CUDA_SUCCESS) {
                first = results[i];
              }
            }
            const bool sessionLive = !alive.expired() && *alive.lock();
            if (sessionLive) settled(first == CUDA_SUCCESS);
            if (sessionLive && first == CUDA_SUCCESS) {
              stats->pinnedMemoryUsed += bytes;
              fulfiller->fulfill(CUDA_SUCCESS);
              return kj::Promise<void>(kj::READY_NOW);
            }
            fulfiller->fulfill(first != CUDA_SUCCESS ? first : CUDA_ERROR_CONTEXT_IS_DESTROYED);
            return unregisterFromAll(registered, host)
                .then([stats, bytes, keepAlive = std::move(keepAlive)]() {
                  stats->tenant->creditPinned(bytes);
                });
          }));
  return kj::mv(answer.promise);
}

kj::Promise<void> ClientSession::unpinFromEveryGpu(void* host, std::uint64_t bytes,
                                                   std::shared_ptr<const void> keepAlive) {
  auto released = kj::newPromiseAndFulfiller<void>();
  services_.reaper.add(unregisterFromAll(services_.gpus, host)
                           .then([bytes, stats = stats_, keepAlive = std::move(keepAlive),
                                  fulfiller = kj::mv(released.fulfiller)]() mutable {
                             stats->tenant->creditPinned(bytes);
                             stats->pinnedMemoryUsed -= bytes;
                             // Unmapped here, before the client hears that it may unmap the range
                             // too: its next mapping may land at the same address, which the
                             // daemon must then have free to map it again.
                             keepAlive.reset();
                             fulfiller->fulfill();
                           }));
  return kj::mv(released.promise);
}

kj::Promise<void> ClientSession::registerPinned(RegisterPinnedContext context) {
  auto params = context.getParams();
  return registerPinnedRange(params.getOffset(), params.getBytes())
      .then([context](CUresult result) mutable { context.getResults().setResult(result); });
}

kj::Promise<void> ClientSession::unregisterPinned(UnregisterPinnedContext context) {
  const std::uint64_t offset = context.getParams().getOffset();
  const std::optional<std::uint64_t> removed = pinned_->remove(offset);
  if (!removed) {
    context.getResults().setResult(CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  const std::uint64_t bytes = *removed;
  retiring_.emplace(offset, bytes);
  // Work queued before this call may still read or write the range: as cuMemFreeHost does, wait
  // for all of it. If the session ends meanwhile, its teardown releases the range instead.
  kj::Vector<kj::Promise<void>> drains;
  for (auto& [device, client] : clients_) {
    drains.add(onGpu(*client, [](GpuClient& client) { return client.drain(); }));
  }
  std::weak_ptr<bool> alive = alive_;
  return kj::joinPromises(drains.releaseAsArray())
      .then([this, alive, offset, bytes, context]() mutable -> kj::Promise<void> {
        if (alive.expired() || !*alive.lock()) {
          context.getResults().setResult(CUDA_SUCCESS);
          return kj::READY_NOW;
        }
        // From here on the range is this call's to release, not the teardown's, and the release
        // is the reaper's task, so that it completes even if the client goes away meanwhile.
        retiring_.erase(offset);
        return unpinFromEveryGpu(segment_->pinnedHeap().data() + offset, bytes, segment_)
            .then([context]() mutable { context.getResults().setResult(CUDA_SUCCESS); });
      });
}

kj::Promise<void> ClientSession::registerHostRange(RegisterHostRangeContext context) {
  auto params = context.getParams();
  const std::uint64_t address = params.getAddress();
  const std::uint64_t bytes = params.getBytes();
  const std::uint64_t fileOffset = params.getFileOffset();
  const std::uint64_t page = ipc::pageSize();
  auto answer = [context](CUresult result) mutable { context.getResults().setResult(result); };
  if (bytes == 0 || address == 0 || address % page != 0 || bytes % page != 0 ||
      fileOffset % page != 0 || address + bytes < address) {
    answer(CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  // Overlapping another of its ranges; the pinned heap cannot be overlapped, being mapped here.
  if (overlapsAnyRange(hostWindows_, address, bytes)) {
    answer(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    return kj::READY_NOW;
  }
  if (hostWindows_.size() >= protocol::kMaxHostRangesPerSession) {
    spdlog::info("pid {}: cuMemHostRegister refused: {} host ranges registered already",
                 stats_->identity.pid, hostWindows_.size());
    answer(CUDA_ERROR_OUT_OF_MEMORY);
    return kj::READY_NOW;
  }
  return params.getFile().getFd().then([this, alive = std::weak_ptr<bool>(alive_), address, bytes,
                                        fileOffset, answer](
                                           kj::Maybe<int> received) mutable -> kj::Promise<void> {
    if (alive.expired() || !*alive.lock()) {
      answer(CUDA_ERROR_CONTEXT_IS_DESTROYED);
      return kj::READY_NOW;
    }
    int fd = -1;
    KJ_IF_MAYBE (descriptor, received) {
      fd = ::fcntl(*descriptor, F_DUPFD_CLOEXEC, 0);
    }
    if (fd < 0) {
      answer(CUDA_ERROR_INVALID_VALUE);
      return kj::READY_NOW;
    }
    // The range may have been taken while the descriptor arrived.
    if (overlapsAnyRange(hostWindows_, address, bytes)) {
      ::close(fd);
      answer(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
      return kj::READY_NOW;
    }
    // The limit first: whether the tenant may pin more does not depend on where the memory lies.
    if (!chargePinned(bytes)) {
      ::close(fd);
      answer(CUDA_ERROR_OUT_OF_MEMORY);
      return kj::READY_NOW;
    }
    std::shared_ptr<ipc::SharedSegment> mapping;
    try {
      mapping = std::make_shared<ipc::SharedSegment>(ipc::SharedSegment::mapWindow(
          ipc::UniqueFd(fd), fileOffset, bytes, reinterpret_cast<void*>(address)));
    } catch (const std::system_error& error) {
      stats_->tenant->creditPinned(bytes);
      spdlog::info("pid {}: cuMemHostRegister of {} bytes at {:#x} refused: {}",
                   stats_->identity.pid, bytes, address, error.what());
      answer(error.code().value() == EEXIST ? CUDA_ERROR_ALREADY_MAPPED : CUDA_ERROR_INVALID_VALUE);
      return kj::READY_NOW;
    }
    hostWindows_.emplace(address, HostWindow{bytes, mapping, HostWindow::State::kRegistering});
    return pinForEveryGpu(mapping->data(), bytes, mapping,
                          [this, address](bool registered) {
                            if (registered) {
                              hostWindows_.at(address).state = HostWindow::State::kLive;
                            } else {
                              hostWindows_.erase(address);
                            }
                          })
        .then([answer](CUresult result) mutable { answer(result); });
  });
}

kj::Promise<void> ClientSession::unregisterHostRange(UnregisterHostRangeContext context) {
  const std::uint64_t address = context.getParams().getAddress();
  auto found = hostWindows_.find(address);
  if (found == hostWindows_.end() || found->second.state != HostWindow::State::kLive) {
    context.getResults().setResult(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    return kj::READY_NOW;
  }
  found->second.state = HostWindow::State::kRetiring;
  // As unregisterPinned: the work queued before this call may use the range.
  kj::Vector<kj::Promise<void>> drains;
  for (auto& [device, client] : clients_) {
    drains.add(onGpu(*client, [](GpuClient& client) { return client.drain(); }));
  }
  std::weak_ptr<bool> alive = alive_;
  return kj::joinPromises(drains.releaseAsArray())
      .then([this, alive, address, context]() mutable -> kj::Promise<void> {
        if (alive.expired() || !*alive.lock()) {
          context.getResults().setResult(CUDA_SUCCESS);
          return kj::READY_NOW;
        }
        HostWindow window = std::move(hostWindows_.at(address));
        hostWindows_.erase(address);
        void* host = window.mapping->data();
        return unpinFromEveryGpu(host, window.bytes, std::move(window.mapping))
            .then([context]() mutable { context.getResults().setResult(CUDA_SUCCESS); });
      });
}

void ClientSession::releasePinnedAtTeardown(kj::Promise<void> drained) {
  // Each range still registered, with what keeps it mapped: the segment, or its own mapping.
  struct Held {
    void* host;
    std::uint64_t bytes;
    std::shared_ptr<const void> mapping;
  };
  std::vector<Held> held;
  LivePinnedAllocations::Ranges live = pinned_->removeAll();
  if (segment_) {
    for (const auto* table : {&live, &retiring_}) {
      for (const auto& [offset, bytes] : *table) {
        held.push_back(Held{segment_->pinnedHeap().data() + offset, bytes, segment_});
      }
    }
  }
  retiring_.clear();
  for (auto& [address, window] : hostWindows_) {
    // One still registering is released where its registration ends (pinForEveryGpu).
    if (window.state == HostWindow::State::kRegistering) continue;
    held.push_back(Held{window.mapping->data(), window.bytes, window.mapping});
  }
  hostWindows_.clear();
  if (held.empty()) return;
  std::uint64_t total = 0;
  for (const Held& range : held) total += range.bytes;
  services_.reaper.add(drained.then(
      [gpus = services_.gpus, held = std::move(held), total, stats = stats_]() mutable {
        kj::Vector<kj::Promise<void>> unregistered;
        for (const Held& range : held) unregistered.add(unregisterFromAll(gpus, range.host));
        return kj::joinPromises(unregistered.releaseAsArray())
            .then([total, stats, held = std::move(held)]() {
              stats->tenant->creditPinned(total);
              stats->pinnedMemoryUsed -= total;
              spdlog::info("reclaimed {} bytes of pinned host memory of pid {}", total,
                           stats->identity.pid);
            });
      }));
}

}  // namespace gpuproxy::server
