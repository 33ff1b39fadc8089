// Pinned host memory of one session: ranges of its data-plane segment's pinned heap that the
// client's allocator hands out (cuMemHostAlloc) and registers here. The daemon never reads the
// allocator's own bookkeeping, which lives in the same memory and which the client can scribble
// over; it keeps its own table of ranges, checks each new one against it, charges the tenant and
// registers the range with every GPU as device-mapped host memory. The segment is mapped at the
// same address in both processes, so the range's address here is the application's pointer.

#include "server/session/client_session.hpp"

#include "ipc/shared_segment.hpp"

#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include <iterator>
#include <utility>
#include <vector>

namespace gpuproxy::server {

namespace {

bool overlapsAny(const std::map<std::uint64_t, std::uint64_t>& ranges, std::uint64_t offset,
                 std::uint64_t bytes) {
  auto next = ranges.lower_bound(offset);
  if (next != ranges.end() && next->first < offset + bytes) return true;
  if (next == ranges.begin()) return false;
  auto previous = std::prev(next);
  return previous->first + previous->second > offset;
}

// Unregisters `host` from the GPUs in `gpus` (all of them had it registered), on their
// blocking-call threads; resolves once every one has.
kj::Promise<void> unregisterFromAll(const std::vector<GpuShard*>& gpus, void* host) {
  kj::Vector<kj::Promise<void>> unregistered;
  for (GpuShard* gpu : gpus) {
    unregistered.add(
        gpu->unregisterHostMemory(host).then([index = gpu->index(), host](CUresult result) {
          if (result != CUDA_SUCCESS) {
            spdlog::warn("device {}: unregistering pinned host memory at {} failed: CUresult {}",
                         index, host, static_cast<int>(result));
          }
        }));
  }
  return kj::joinPromises(unregistered.releaseAsArray());
}

std::vector<GpuShard*> allGpus(const Gpus& all) {
  std::vector<GpuShard*> gpus;
  for (const auto& gpu : all) gpus.push_back(gpu.get());
  return gpus;
}

}  // namespace

kj::Promise<CUresult> ClientSession::registerPinnedRange(std::uint64_t offset,
                                                         std::uint64_t bytes) {
  if (!channel_ || channel_->pinnedHeap().empty()) return CUDA_ERROR_NOT_SUPPORTED;
  const std::span<std::byte> heap = channel_->pinnedHeap();
  const std::uint64_t page = ipc::pageSize();
  if (bytes == 0 || offset % page != 0 || bytes % page != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset > heap.size() || bytes > heap.size() - offset) return CUDA_ERROR_INVALID_VALUE;
  if (overlapsAny(pinned_, offset, bytes) || overlapsAny(retiring_, offset, bytes) ||
      overlapsAny(registering_, offset, bytes)) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  Tenant& tenant = *stats_->tenant;
  if (!tenant.tryChargePinned(bytes)) {
    spdlog::info("pid {}: {} bytes of pinned memory refused: tenant '{}' holds {} of its {}",
                 stats_->identity.pid, bytes, tenant.name(), tenant.pinnedMemoryUsed(),
                 tenant.limits().pinnedMemoryLimit.value_or(0));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* host = heap.data() + offset;
  registering_.emplace(offset, bytes);
  std::vector<GpuShard*> gpus = allGpus(services_.gpus);
  kj::Vector<kj::Promise<CUresult>> registrations;
  for (GpuShard* gpu : gpus) {
    registrations.add(gpu->registerHostMemory(host, bytes, stats_->addressSpace));
  }
  // Pinning is done on each GPU's blocking-call thread. What follows must run even if the client
  // goes away meanwhile (the range is then unregistered and credited here, not by the teardown),
  // so it is the reaper's task, and the call is answered through a fulfiller.
  auto answer = kj::newPromiseAndFulfiller<CUresult>();
  services_.reaper.add(
      kj::joinPromises(registrations.releaseAsArray())
          .then([this, alive = std::weak_ptr<bool>(alive_), gpus = std::move(gpus), host, offset,
                 bytes, stats = stats_, segment = channel_->keepAlive(),
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
            if (sessionLive) registering_.erase(offset);
            if (sessionLive && first == CUDA_SUCCESS) {
              pinned_.emplace(offset, bytes);
              stats->pinnedMemoryUsed += bytes;
              fulfiller->fulfill(CUDA_SUCCESS);
              return kj::Promise<void>(kj::READY_NOW);
            }
            fulfiller->fulfill(first != CUDA_SUCCESS ? first : CUDA_ERROR_CONTEXT_IS_DESTROYED);
            return unregisterFromAll(registered, host)
                .then([stats, bytes, segment = kj::mv(segment)]() {
                  stats->tenant->creditPinned(bytes);
                });
          }));
  return kj::mv(answer.promise);
}

kj::Promise<void> ClientSession::registerPinned(RegisterPinnedContext context) {
  auto params = context.getParams();
  return registerPinnedRange(params.getOffset(), params.getBytes())
      .then([context](CUresult result) mutable { context.getResults().setResult(result); });
}

kj::Promise<void> ClientSession::unregisterPinned(UnregisterPinnedContext context) {
  const std::uint64_t offset = context.getParams().getOffset();
  auto found = pinned_.find(offset);
  if (found == pinned_.end()) {
    context.getResults().setResult(CUDA_ERROR_INVALID_VALUE);
    return kj::READY_NOW;
  }
  const std::uint64_t bytes = found->second;
  pinned_.erase(found);
  retiring_.emplace(offset, bytes);
  // Work queued before this call may still read or write the range: as cuMemFreeHost does, wait
  // for all of it. If the session ends meanwhile, its teardown releases the range instead.
  kj::Vector<kj::Promise<void>> drains;
  for (auto& [device, client] : clients_) drains.add(client->drain());
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
        auto released = kj::newPromiseAndFulfiller<void>();
        services_.reaper.add(
            unregisterFromAll(allGpus(services_.gpus), channel_->pinnedHeap().data() + offset)
                .then([bytes, stats = stats_, segment = channel_->keepAlive(),
                       fulfiller = kj::mv(released.fulfiller)]() mutable {
                  stats->tenant->creditPinned(bytes);
                  stats->pinnedMemoryUsed -= bytes;
                  fulfiller->fulfill();
                }));
        return released.promise.then(
            [context]() mutable { context.getResults().setResult(CUDA_SUCCESS); });
      });
}

void ClientSession::releasePinnedAtTeardown(kj::Promise<void> drained) {
  if (!channel_ || (pinned_.empty() && retiring_.empty())) return;
  std::vector<std::pair<void*, std::uint64_t>> ranges;
  std::uint64_t total = 0;
  for (const auto* table : {&pinned_, &retiring_}) {
    for (const auto& [offset, bytes] : *table) {
      ranges.emplace_back(channel_->pinnedHeap().data() + offset, bytes);
      total += bytes;
    }
  }
  pinned_.clear();
  retiring_.clear();
  services_.reaper.add(
      drained.then([gpus = allGpus(services_.gpus), ranges = std::move(ranges), total,
                    stats = stats_, segment = channel_->keepAlive()]() mutable {
        kj::Vector<kj::Promise<void>> unregistered;
        for (const auto& [host, bytes] : ranges) unregistered.add(unregisterFromAll(gpus, host));
        return kj::joinPromises(unregistered.releaseAsArray())
            .then([total, stats, segment = kj::mv(segment)]() {
              stats->tenant->creditPinned(total);
              stats->pinnedMemoryUsed -= total;
              spdlog::info("reclaimed {} bytes of pinned host memory of pid {}", total,
                           stats->identity.pid);
            });
      }));
}

bool ClientSession::pinnedRangeIsLive(std::uint64_t offset, std::uint64_t bytes) const {
  // The allocation that starts at or before `offset` must hold the whole range.
  auto after = pinned_.upper_bound(offset);
  if (after == pinned_.begin()) return false;
  const auto& [start, length] = *std::prev(after);
  const std::uint64_t into = offset - start;
  return into < length && bytes <= length - into;
}

}  // namespace gpuproxy::server
