// Pinned host memory of one session: ranges of its data-plane segment's pinned heap that the
// client's allocator hands out (cuMemHostAlloc) and registers here. The daemon never reads the
// allocator's own bookkeeping, which lives in the same memory and which the client can scribble
// over; it keeps its own table of ranges, checks each new one against it, charges the tenant and
// registers the range with every GPU as device-mapped host memory. The segment is mapped at the
// same address in both processes, so the range's address here is the application's pointer.

#include "server/session/client_session.hpp"

#include "ipc/shared_segment.hpp"

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

// Unregisters `host` from the GPUs in `gpus` (all of them had it registered).
void unregisterFromAll(const std::vector<GpuShard*>& gpus, void* host) {
  for (GpuShard* gpu : gpus) {
    const CUresult result = gpu->device().unregisterHostMemory(host);
    if (result != CUDA_SUCCESS) {
      spdlog::warn("device {}: unregistering pinned host memory at {} failed: CUresult {}",
                   gpu->index(), host, static_cast<int>(result));
    }
  }
}

std::vector<GpuShard*> allGpus(ServerState& state) {
  std::vector<GpuShard*> gpus;
  for (auto& gpu : state.gpus) gpus.push_back(gpu.get());
  return gpus;
}

}  // namespace

CUresult ClientSession::registerPinnedRange(std::uint64_t offset, std::uint64_t bytes) {
  if (!channel_ || channel_->pinnedHeap().empty()) return CUDA_ERROR_NOT_SUPPORTED;
  const std::span<std::byte> heap = channel_->pinnedHeap();
  const std::uint64_t page = ipc::pageSize();
  if (bytes == 0 || offset % page != 0 || bytes % page != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset > heap.size() || bytes > heap.size() - offset) return CUDA_ERROR_INVALID_VALUE;
  if (overlapsAny(pinned_, offset, bytes) || overlapsAny(retiring_, offset, bytes)) {
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
  std::vector<GpuShard*> registered;
  for (auto& gpu : state_.gpus) {
    const CUresult result = gpu->device().registerHostMemory(host, bytes, stats_->addressSpace);
    if (result != CUDA_SUCCESS) {
      unregisterFromAll(registered, host);
      tenant.creditPinned(bytes);
      return result;
    }
    registered.push_back(gpu.get());
  }
  pinned_.emplace(offset, bytes);
  stats_->pinnedMemoryUsed += bytes;
  return CUDA_SUCCESS;
}

kj::Promise<void> ClientSession::registerPinned(RegisterPinnedContext context) {
  auto params = context.getParams();
  context.getResults().setResult(registerPinnedRange(params.getOffset(), params.getBytes()));
  return kj::READY_NOW;
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
      .then([this, alive, offset, bytes, context]() mutable {
        if (alive.expired() || !*alive.lock()) {
          context.getResults().setResult(CUDA_SUCCESS);
          return;
        }
        retiring_.erase(offset);
        unregisterFromAll(allGpus(state_), channel_->pinnedHeap().data() + offset);
        stats_->tenant->creditPinned(bytes);
        stats_->pinnedMemoryUsed -= bytes;
        context.getResults().setResult(CUDA_SUCCESS);
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
  state_.reaper->add(drained.then([gpus = allGpus(state_), ranges = std::move(ranges), total,
                                   stats = stats_, segment = channel_->keepAlive()]() {
    for (const auto& [host, bytes] : ranges) unregisterFromAll(gpus, host);
    stats->tenant->creditPinned(total);
    stats->pinnedMemoryUsed -= total;
    spdlog::info("reclaimed {} bytes of pinned host memory of pid {}", total, stats->identity.pid);
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
