#include "server/data_plane/data_plane.hpp"

#include <spdlog/spdlog.h>

namespace gpuproxy::server {

namespace {

// Commands taken from one ring per pass, so that one busy client cannot hold up the others.
constexpr std::size_t kCommandsPerPass = 256;

}  // namespace

DataPlane::DataPlane(kj::UnixEventPort& port, DataPlaneOptions options)
    : poller_(ipc::newPoller(options.poller,
                             [](std::string_view line) { spdlog::info("data plane: {}", line); })),
      observer_(port, poller_->readinessFd(), kj::UnixEventPort::FdObserver::OBSERVE_READ),
      options_(options) {}

DataPlane::~DataPlane() = default;

void DataPlane::add(ClientChannel& channel) {
  const std::uint64_t token = nextToken_++;
  poller_->add(channel.doorbellFd(), token);
  channels_.emplace(token, &channel);
  tokens_.emplace(&channel, token);
  // A new client starts talking at once; do not make its first command wait for a doorbell.
  lastWork_ = std::chrono::steady_clock::now();
  poller_->wake();
}

void DataPlane::remove(ClientChannel& channel) {
  auto found = tokens_.find(&channel);
  if (found == tokens_.end()) return;
  poller_->remove(channel.doorbellFd());
  channels_.erase(found->second);
  tokens_.erase(found);
}

bool DataPlane::pumpAll() {
  bool worked = false;
  // A command may end its own session (a framing error evicts the client), which removes its
  // channel from the map: iterate over a snapshot of the tokens and look each one up again.
  std::vector<std::uint64_t> tokens;
  tokens.reserve(channels_.size());
  for (const auto& [token, channel] : channels_) tokens.push_back(token);
  for (std::uint64_t token : tokens) {
    auto found = channels_.find(token);
    if (found == channels_.end()) continue;
    if (found->second->pump(kCommandsPerPass) > 0) worked = true;
  }
  return worked;
}

kj::Promise<void> DataPlane::run() {
  return spin();
}

kj::Promise<void> DataPlane::spin() {
  const auto now = std::chrono::steady_clock::now();
  if (pumpAll()) lastWork_ = now;
  if (now - lastWork_ < options_.spinWindow) {
    return kj::evalLater([this]() { return spin(); });
  }
  return sleep();
}

kj::Promise<void> DataPlane::sleep() {
  for (auto& [token, channel] : channels_) channel->prepareToSleep();
  bool work = false;
  for (auto& [token, channel] : channels_) work = work || channel->hasWork();
  // Arms the doorbell polls (io_uring submits them here) and takes what is already readable.
  poller_->wait(ready_, std::chrono::nanoseconds(0));
  if (work || !ready_.empty()) {
    for (auto& [token, channel] : channels_) channel->finishSleep();
    lastWork_ = std::chrono::steady_clock::now();
    return kj::evalLater([this]() { return spin(); });
  }
  return observer_.whenBecomesReadable().then([this]() {
    poller_->wait(ready_, std::chrono::nanoseconds(0));
    for (auto& [token, channel] : channels_) channel->finishSleep();
    lastWork_ = std::chrono::steady_clock::now();
    return spin();
  });
}

}  // namespace gpuproxy::server
