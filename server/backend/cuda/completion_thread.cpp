#include "server/backend/cuda/completion_thread.hpp"

#include <pthread.h>

#include <spdlog/spdlog.h>

#include <exception>
#include <mutex>
#include <unordered_set>

namespace gpuproxy::server::cuda {

struct CompletionThread::State {
  std::string name;
  std::mutex mutex;
  std::condition_variable wake;   // the thread waits on it
  std::condition_variable quiet;  // drain() and waitUntilNothingExpected() wait on it
  std::uint64_t nextId = 1;
  std::unordered_map<std::uint64_t, Work> expected;
  std::deque<std::pair<Work, CUresult>> ready;
  bool running = false;  // the thread is running an item's work
  bool stopping = false;
};

// The userData of one host function. Only hostFunction() and cancel() delete it: a host function
// the driver never calls (the context faulted or was reset, or the process is exiting) keeps its
// small token for good, which is safer than freeing memory the driver might still hand back.
struct CompletionThread::Token {
  std::weak_ptr<State> state;
  std::uint64_t id = 0;
};

namespace {

// Owns every token from expect() until hostFunction() or cancel() takes it back, so that one the
// driver never hands back is still owned rather than lost. Never destroyed: a host function may
// come during exit.
struct OutstandingTokens {
  std::mutex mutex;
  std::unordered_set<const void*> tokens;
};

OutstandingTokens& outstandingTokens() {
  static auto* tokens = new OutstandingTokens;
  return *tokens;
}

void* holdToken(const void* token) {
  OutstandingTokens& all = outstandingTokens();
  std::lock_guard lock(all.mutex);
  all.tokens.insert(token);
  return const_cast<void*>(token);
}

void releaseToken(const void* token) {
  OutstandingTokens& all = outstandingTokens();
  std::lock_guard lock(all.mutex);
  all.tokens.erase(token);
}

}  // namespace

CompletionThread::CompletionThread(std::string name, Probe probe)
    : state_(std::make_shared<State>()), probe_(std::move(probe)) {
  state_->name = std::move(name);
  thread_ = std::thread(run, state_, std::cref(probe_));
  // Best effort: lets operators tell the thread apart in top and gdb.
  pthread_setname_np(thread_.native_handle(), state_->name.substr(0, 15).c_str());
}

CompletionThread::~CompletionThread() {
  stop();
}

void* CompletionThread::expect(Work work) {
  auto* token = new Token{state_, 0};
  {
    std::lock_guard lock(state_->mutex);
    token->id = state_->nextId++;
    const bool wasEmpty = state_->expected.empty();
    state_->expected.emplace(token->id, std::move(work));
    if (wasEmpty) {
      state_->wake.notify_one();  // so the thread starts probing
    }
  }
  return holdToken(token);
}

CompletionThread::Work CompletionThread::cancel(void* userData) {
  auto* token = static_cast<Token*>(userData);
  Work work;
  {
    std::lock_guard lock(state_->mutex);
    auto found = state_->expected.find(token->id);
    if (found != state_->expected.end()) {
      work = std::move(found->second);
      state_->expected.erase(found);
    }
    if (state_->expected.empty()) {
      state_->quiet.notify_all();
    }
  }
  releaseToken(token);
  delete token;
  return work;
}

void CUDA_CB CompletionThread::hostFunction(void* userData) {
  // Runs on the driver's callback thread: no CUDA calls, nothing slow.
  auto* token = static_cast<Token*>(userData);
  if (auto state = token->state.lock()) {
    std::lock_guard lock(state->mutex);
    auto found = state->expected.find(token->id);
    if (found != state->expected.end()) {
      state->ready.emplace_back(std::move(found->second), CUDA_SUCCESS);
      state->expected.erase(found);
      state->wake.notify_one();
      if (state->expected.empty()) {
        state->quiet.notify_all();
      }
    }
  }
  releaseToken(token);
  delete token;
}

void CompletionThread::post(Work work, CUresult status) {
  std::lock_guard lock(state_->mutex);
  state_->ready.emplace_back(std::move(work), status);
  state_->wake.notify_one();
}

void CompletionThread::failExpected(CUresult status) {
  std::lock_guard lock(state_->mutex);
  if (state_->expected.empty()) {
    return;
  }
  spdlog::warn("{}: failing {} pending completion(s) with CUDA error {}", state_->name,
               state_->expected.size(), static_cast<int>(status));
  for (auto& [id, work] : state_->expected) {
    state_->ready.emplace_back(std::move(work), status);
  }
  state_->expected.clear();
  state_->wake.notify_one();
  state_->quiet.notify_all();
}

bool CompletionThread::waitUntilNothingExpected(std::chrono::milliseconds limit) {
  std::unique_lock lock(state_->mutex);
  return state_->quiet.wait_for(lock, limit, [&] { return state_->expected.empty(); });
}

void CompletionThread::drain() {
  std::unique_lock lock(state_->mutex);
  state_->quiet.wait(lock, [&] { return state_->ready.empty() && !state_->running; });
}

void CompletionThread::stop() {
  if (!thread_.joinable()) {
    return;
  }
  {
    std::lock_guard lock(state_->mutex);
    for (auto& [id, work] : state_->expected) {
      state_->ready.emplace_back(std::move(work), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    state_->expected.clear();
    state_->stopping = true;
    state_->wake.notify_one();
  }
  thread_.join();
}

void CompletionThread::run(const std::shared_ptr<State>& state, const Probe& probe) {
  std::unique_lock lock(state->mutex);
  for (;;) {
    if (!state->ready.empty()) {
      auto item = std::move(state->ready.front());
      state->ready.pop_front();
      state->running = true;
      lock.unlock();
      try {
        item.first(item.second);
      } catch (const std::exception& error) {
        spdlog::error("{}: a completion callback threw: {}", state->name, error.what());
      } catch (...) {
        spdlog::error("{}: a completion callback threw", state->name);
      }
      item.first = nullptr;  // whatever the work captured goes before we take the lock again
      lock.lock();
      state->running = false;
      if (state->ready.empty()) {
        state->quiet.notify_all();
      }
      continue;
    }
    if (state->stopping) {
      return;
    }
    if (state->expected.empty()) {
      state->wake.wait(lock);
      continue;
    }
    const bool woken = state->wake.wait_for(
        lock, kProbeInterval, [&] { return !state->ready.empty() || state->stopping; });
    if (!woken && !state->expected.empty() && probe) {
      lock.unlock();
      probe();
      lock.lock();
    }
  }
}

}  // namespace gpuproxy::server::cuda
