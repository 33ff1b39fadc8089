#pragma once
// One operation a client has queued on a GPU, counted against the client's bound on queued work
// (ClientStats::queueFull) for as long as it exists. The callback the daemon attaches to the
// operation owns it, so the count drops when the backend has run that callback, or dropped it
// (a gone client's work, a reset): no path can forget to uncount.

#include "server/gpu/client_stats.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace gpuproxy::server {

class QueuedWork {
public:
  // `bytes`: what the daemon holds for the operation until it is done (kernel parameters, host
  // data copied out of a message).
  QueuedWork(std::shared_ptr<ClientStats> stats, std::uint64_t bytes)
      : stats_(std::move(stats)), bytes_(static_cast<std::int64_t>(bytes)) {
    ++stats_->operationsInFlight;
    stats_->bytesInFlight += bytes_;
  }
  ~QueuedWork() {
    if (!stats_) return;
    --stats_->operationsInFlight;
    stats_->bytesInFlight -= bytes_;
  }
  QueuedWork(QueuedWork&& other) noexcept
      : stats_(std::move(other.stats_)), bytes_(std::exchange(other.bytes_, 0)) {}
  QueuedWork& operator=(QueuedWork&&) = delete;
  QueuedWork(const QueuedWork&) = delete;
  QueuedWork& operator=(const QueuedWork&) = delete;

  // The client it counts against.
  const std::shared_ptr<ClientStats>& stats() const { return stats_; }

private:
  std::shared_ptr<ClientStats> stats_;
  std::int64_t bytes_;
};

}  // namespace gpuproxy::server
