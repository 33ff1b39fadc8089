#include "client/stub/host_functions.hpp"

#include <thread>
#include <utility>
#include <vector>

#include "client/stub/data_plane.hpp"
#include "client/stub/log.hpp"

namespace gpuproxy::stub {

namespace ring = protocol::ring;

HostFunctions::HostFunctions(DataPlane& dataPlane) : dataPlane_(dataPlane) {
  // Detached: like the stub itself, it lives until the process exits.
  std::thread([this] { threadMain(); }).detach();
}

CUresult HostFunctions::launch(std::uint64_t context, std::uint64_t stream,
                               std::function<void(CUresult)> run) {
  ring::HostFunction record;
  record.context = context;
  record.stream = stream;
  record.completionToken = dataPlane_.newToken();
  {
    // Listed before the record is sent: its answer may come at once.
    std::lock_guard lock(mutex_);
    pending_.emplace(record.completionToken, Pending{context, stream, std::move(run)});
  }
  const CUresult sent = dataPlane_.submitCommand(record);
  std::lock_guard lock(mutex_);
  if (sent != CUDA_SUCCESS) {
    pending_.erase(record.completionToken);
    return sent;
  }
  queued_.notify_one();
  return CUDA_SUCCESS;
}

void HostFunctions::threadMain() {
  std::vector<std::uint64_t> tokens;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return !pending_.empty(); });
      tokens.clear();
      for (const auto& [token, pending] : pending_) tokens.push_back(token);
    }
    const auto due = dataPlane_.waitForAny(tokens);
    if (!due) continue;  // nothing due yet; look again (new functions may have been queued)
    const auto [token, status] = *due;
    std::vector<std::pair<std::uint64_t, Pending>> ready;
    {
      std::lock_guard lock(mutex_);
      if (token == 0) {
        // gpuproxyd is gone: nothing will ever be due; each function hears so.
        for (auto& entry : pending_) ready.emplace_back(entry.first, std::move(entry.second));
        pending_.clear();
      } else if (auto found = pending_.find(token); found != pending_.end()) {
        ready.emplace_back(token, std::move(found->second));
        pending_.erase(found);
      }
    }
    for (auto& [readyToken, pending] : ready) {
      pending.run(token == 0 ? CUDA_ERROR_MPS_CONNECTION_FAILED : status);
      if (token == 0) continue;
      ring::HostFunctionReturned returned;
      returned.context = pending.context;
      returned.stream = pending.stream;
      returned.token = readyToken;
      if (CUresult sent = dataPlane_.submitCommand(returned); sent != CUDA_SUCCESS) {
        GPUPROXY_STUB_LOG(kDebug, "host function %llu returned, but gpuproxyd was not told (%d)",
                          static_cast<unsigned long long>(readyToken), static_cast<int>(sent));
      }
    }
  }
}

}  // namespace gpuproxy::stub
