#pragma once
// Bridges backend completion callbacks (which run on a backend thread) to kj promises on the
// event loop of the thread that owns the GPU. A callback that fires after its promise was dropped
// (the client went away) is harmless: the cross-thread fulfiller simply finds nobody waiting.

#include "server/backend/backend.hpp"

#include <kj/async.h>

#include <memory>

namespace gpuproxy::server {

// A promise for the status of all work queued so far on `stream`.
kj::Promise<CUresult> whenStreamDone(backend::Stream& stream);

// A promise for the completion of `event`'s most recent record.
kj::Promise<CUresult> whenEventDone(backend::Event& event);

// A backend callback and the promise on the calling thread's event loop that it fulfils.
struct CallbackOnLoop {
  backend::CompletionCallback callback;
  kj::Promise<CUresult> promise;
};
CallbackOnLoop callbackOnLoop();

// Waits for all `statuses` and answers the first error among them (CUDA_SUCCESS if none).
kj::Promise<CUresult> firstError(kj::Array<kj::Promise<CUresult>> statuses);

}  // namespace gpuproxy::server
