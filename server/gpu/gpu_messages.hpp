#pragma once
// How whoever is not part of a GPU (a client's session, status, a tenant's change) reaches that
// GPU's state: by a message to the thread that owns it (GpuShard::executor()), whose answer comes
// back as a promise on the sender's thread. A message carries values to the GPU and its answer
// carries values back; nothing outside the GPU keeps a reference into its state past a message,
// so the GPU can be served by a thread (or a process) of its own.
//
// Messages from one thread to one GPU run in the order they were sent (kj::Executor's E-order):
// a message that uses a GpuClient, sent before the one that destroys it, finds it still there. A
// message whose answer nobody waits for any more (its promise dropped) is cancelled if it has not
// begun. The work itself is destroyed on the sender's thread after it has run, so it must not
// hold GPU state that is the GPU's to destroy.
//
// The hand-over of a message between threads happens inside kj (a mutex and reference counts of
// its own), which TSan sees because its builds link a kj compiled with TSan
// (cmake/GpuproxyThreadSanitizedCapnp.cmake).
//
// In the daemon each GPU has a thread of its own (GpuThread); where a test makes a GpuShard on its
// own thread, a message is a later turn of that thread's loop.

#include "server/gpu/gpu_client.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <kj/async.h>
#include <kj/debug.h>

#include <memory>
#include <utility>

namespace gpuproxy::server {

// Runs `work(gpu)` on `gpu`'s owner thread; the promise (of what `work` gives, unwrapped when that
// is itself a promise) resolves on the calling thread.
template <typename Work>
auto onGpu(GpuShard& gpu, Work work) {
  return gpu.executor().executeAsync(
      [&gpu, work = std::move(work)]() mutable { return work(gpu); });
}

// Runs `work(client)` on the owner thread of the client's GPU.
template <typename Work>
auto onGpu(GpuClient& client, Work work) {
  return client.executor().executeAsync(
      [&client, work = std::move(work)]() mutable { return work(client); });
}

// Sends `work(gpu)` to `gpu` with nobody waiting for its answer (a tenant's change the scheduler
// must learn); a failure is logged.
template <typename Work>
void tellGpu(GpuShard& gpu, Work work) {
  onGpu(gpu, std::move(work)).detach([index = gpu.index()](kj::Exception&& exception) {
    KJ_LOG(ERROR, "a message to a GPU failed", index, exception);
  });
}

// tellGpu for the client's GPU: a message to a GpuClient nobody waits for (the other half of a
// wait across GPUs letting it go).
template <typename Work>
void tellGpu(GpuClient& client, Work work) {
  onGpu(client, std::move(work)).detach([index = client.deviceIndex()](kj::Exception&& exception) {
    KJ_LOG(ERROR, "a message to a GPU failed", index, exception);
  });
}

// State a GPU made for whoever sent it a message (a client's state there), as the message's
// answer. The answer is destroyed on the sender's thread, and is dropped unopened when the sender
// stops waiting (its session went meanwhile): what it still holds then goes back to its GPU by a
// message, to be destroyed there as GPU state must be.
template <typename T>
class MadeOnGpu {
public:
  // Made on the GPU's thread, whose executor `gpu` is.
  MadeOnGpu(std::unique_ptr<T> made, const kj::Executor& gpu)
      : made_(std::move(made)), gpu_(gpu.addRef()) {}
  MadeOnGpu(MadeOnGpu&&) noexcept = default;
  MadeOnGpu& operator=(MadeOnGpu&&) = delete;
  MadeOnGpu(const MadeOnGpu&) = delete;
  MadeOnGpu& operator=(const MadeOnGpu&) = delete;
  ~MadeOnGpu() noexcept {
    if (!made_) return;
    if (&kj::getCurrentThreadExecutor() == gpu_.get()) {
      made_.reset();
      return;
    }
    gpu_->executeAsync([made = made_.release()] { delete made; })
        .detach([](kj::Exception&& exception) {
          KJ_LOG(ERROR, "state made on a GPU could not go back to it", exception);
        });
  }

  // What was made, for the sender to keep (and to destroy on its GPU in time).
  std::unique_ptr<T> take() { return std::move(made_); }

private:
  std::unique_ptr<T> made_;
  kj::Own<const kj::Executor> gpu_;
};

// A tenant's weight or class changed: every GPU's scheduler learns it (GpuShard::refreshTenants).
// `gpus` holds pointers to GpuShards (the daemon's Gpus).
template <typename GpuPointers>
void refreshTenantsOnEveryGpu(const GpuPointers& gpus) {
  for (const auto& gpu : gpus) tellGpu(*gpu, [](GpuShard& gpu) { gpu.refreshTenants(); });
}

}  // namespace gpuproxy::server
