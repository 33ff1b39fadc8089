#include "server/data_plane/data_plane.hpp"

#include <spdlog/spdlog.h>

namespace gpuproxy::server {

namespace {

// Commands taken from one ring per pass, so that one busy client cannot hold up the others.
constexpr std::size_t kCommandsPerPass = 256;

}  // namespace

DataPlane::DataPlane(kj::UnixEventPort& port, kj::Timer& timer, DataPlaneOptions options)
    : poller_(ipc::newPoller(options.poller,
                             [](std::string_view line) { spdlog::info("data plane: {}", line); })),
      observer_(port, poller_->readinessFd(), kj::UnixEventPort::FdObserver::OBSERVE_READ),
      timer_(timer),
      options_(options) {}

DataPlane::~DataPlane() = default;

void DataPlane::add(ClientChannel& channel) {
  const std::uint64_t token = nextToken_++;
  poller_->add(channel.doorbellFd(), token);
  channels_.emplace(token, &channel);
  tokens_.emplace(&channel, token);
  channel.onAnswersWaiting([this]() {
    if (wakeLoop_) wakeLoop_->fulfill();
  });
  // A new client starts talking at once; do not make its first command wait for a doorbell.
  lastWork_ = std::chrono::steady_clock::now();
  if (wakeLoop_) wakeLoop_->fulfill();
}

void DataPlane::remove(ClientChannel& channel) {
  auto found = tokens_.find(&channel);
  if (found == tokens_.end()) return;
  poller_->remove(channel.doorbellFd());
  channel.onAnswersWaiting(nullptr);
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

kj::Promise<void> DataPlane::whenReadable(int fd) {
  const std::uint64_t token = nextToken_++;
  poller_->add(fd, token);
  auto paf = kj::newPromiseAndFulfiller<void>();
  fdWatches_.emplace(token, FdWatch{fd, kj::mv(paf.fulfiller)});
  // Arm it now: a loop that keeps spinning would otherwise arm it only at its next sleep.
  if (harvest() && wakeLoop_) wakeLoop_->fulfill();
  return paf.promise.attach(kj::defer([this, token]() {
    auto found = fdWatches_.find(token);
    if (found == fdWatches_.end()) return;
    poller_->remove(found->second.fd);
    fdWatches_.erase(found);
  }));
}

bool DataPlane::harvest() {
  poller_->wait(ready_, std::chrono::nanoseconds(0));
  bool doorbell = false;
  for (std::uint64_t token : ready_) {
    auto watch = fdWatches_.find(token);
    if (watch == fdWatches_.end()) {
      doorbell = true;
      continue;
    }
    // One-shot: stop watching before anyone can close the descriptor.
    poller_->remove(watch->second.fd);
    auto fulfiller = kj::mv(watch->second.fulfiller);
    fdWatches_.erase(watch);
    fulfiller->fulfill();
  }
  return doorbell;
}

kj::Promise<void> DataPlane::watchPoller() {
  return observer_.whenBecomesReadable().then([this]() {
    if (harvest() && wakeLoop_) wakeLoop_->fulfill();
    return watchPoller();
  });
}

kj::Promise<void> DataPlane::run() {
  pollerWatch_ = watchPoller().eagerlyEvaluate(nullptr);
  return spin();
}

kj::Promise<void> DataPlane::spin() {
  const auto now = std::chrono::steady_clock::now();
  if (pumpAll()) {
    lastWork_ = now;
  } else {
    // A client woken onto this CPU (it waits for the answer just published) must not wait for the
    // spin window to end.
    ipc::yieldCpu();
  }
  if (now - lastWork_ < options_.spinWindow) {
    return kj::evalLater([this]() { return spin(); });
  }
  return sleep();
}

kj::Promise<void> DataPlane::sleep() {
  for (auto& [token, channel] : channels_) channel->prepareToSleep();
  bool work = false;
  bool throttled = false;
  for (auto& [token, channel] : channels_) {
    work = work || channel->hasWork();
    throttled = throttled || channel->throttled() || channel->answersWaiting();
  }
  // Arms the doorbell polls (io_uring submits them here) and takes what is already readable.
  // After this, a doorbell makes the poller's descriptor readable and watchPoller wakes us.
  if (harvest()) work = true;
  auto wake = [this]() {
    wakeLoop_ = nullptr;
    for (auto& [token, channel] : channels_) channel->finishSleep();
    lastWork_ = std::chrono::steady_clock::now();
    return spin();
  };
  if (work) return kj::evalLater(kj::mv(wake));
  auto paf = kj::newPromiseAndFulfiller<void>();
  wakeLoop_ = kj::mv(paf.fulfiller);
  kj::Promise<void> woken = kj::mv(paf.promise);
  // A throttled client's room comes back when its work on the GPU finishes, and room for its
  // answers when it reads its completion ring, neither of which rings a doorbell: look again
  // shortly, without spinning meanwhile.
  if (throttled) woken = woken.exclusiveJoin(afterThrottledRecheck());
  return woken.then(kj::mv(wake));
}

}  // namespace gpuproxy::server
