#include "server/gpu/gpu_shard.hpp"

#include "protocol/cuda_result.hpp"
#include "server/gpu/gpu_client.hpp"

#include <spdlog/spdlog.h>

#include <utility>

namespace gpuproxy::server {

GpuShard::GpuShard(std::uint32_t index, std::unique_ptr<backend::Device> device, kj::Timer& timer,
                     const dispatch::DispatchOptions& dispatch)
    : index_(index),
      device_(std::make_unique<dispatch::ScheduledDevice>(
          std::move(device), dispatch::newScheduler(dispatch), timer)) {}

GpuShard::~GpuShard() {
  // The device first: its threads may still run kernel callbacks that report to this shard.
  device_.reset();
}

std::unique_ptr<GpuClient> GpuShard::openClient(std::shared_ptr<ClientStats> stats) {
  auto client = std::make_unique<GpuClient>(*this, std::move(stats));
  clients_.insert(client.get());
  return client;
}

void GpuShard::detach(GpuClient& client) {
  clients_.erase(&client);
  recoverIfIdle();
}

backend::Result<CUdeviceptr> GpuShard::allocate(std::size_t bytes, backend::AddressSpace owner) {
  return device_->allocate(bytes, owner);
}

CUresult GpuShard::free(CUdeviceptr pointer) {
  // Accounting follows what the client held (its MemoryCharge goes with the allocation), even
  // when a poisoned context refuses the free: the memory comes back with the context reset.
  return device_->free(pointer);
}

void GpuShard::noteKernelStatus(CUresult status, pid_t pid) {
  if (!isStickyError(status)) return;
  bool expected = false;
  if (!faultReported_.compare_exchange_strong(expected, true)) return;
  faultingPid_ = pid;
  const std::string detail = device_->stickyErrorDetail();
  spdlog::error(
      "device {}: a kernel of pid {} failed with {}{}{}: the GPU context is poisoned for every "
      "client on this device; it is recovered once they have all detached",
      index_, pid, protocol::cudaResultNameOr(status, "a sticky error"), detail.empty() ? "" : " (",
      detail.empty() ? "" : detail + ")");
}

void GpuShard::recoverIfIdle() {
  if (!clients_.empty()) return;
  if (device_->stickyError() == CUDA_SUCCESS) return;
  CUresult reset = device_->reset();
  if (reset != CUDA_SUCCESS) {
    spdlog::error("device {}: resetting the poisoned context failed ({})", index_,
                  protocol::cudaResultNameOr(reset, "unknown error"));
    return;
  }
  memoryUsed_ = 0;
  faultingPid_ = 0;
  faultReported_ = false;
  spdlog::warn("device {}: context recovered after a sticky fault; serving new clients", index_);
}

}  // namespace gpuproxy::server
