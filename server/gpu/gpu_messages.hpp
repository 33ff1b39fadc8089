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
// Today every GPU is owned by the event-loop thread, so a message is a later turn of that same
// loop; the shape is what a thread per GPU needs (docs/architecture.md §2).

#include "server/gpu/gpu_client.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <kj/async.h>
#include <kj/debug.h>

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

// A tenant's weight or class changed: every GPU's scheduler learns it (GpuShard::refreshTenants).
// `gpus` holds pointers to GpuShards (the daemon's Gpus).
template <typename GpuPointers>
void refreshTenantsOnEveryGpu(const GpuPointers& gpus) {
  for (const auto& gpu : gpus) tellGpu(*gpu, [](GpuShard& gpu) { gpu.refreshTenants(); });
}

}  // namespace gpuproxy::server
