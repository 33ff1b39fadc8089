#include "server/gpu/completion.hpp"

#include <atomic>
#include <memory>
#include <utility>

namespace gpuproxy::server {

namespace {

using Fulfiller = kj::Own<kj::CrossThreadPromiseFulfiller<CUresult>>;

// What the backend's thread did before the callback (a copy's bytes written into host memory,
// say) must be visible to the event loop once the promise resolves. kj's cross-thread promise
// orders it, with atomics inside libkj-async; this release store and the acquire load in
// `handedOver` make the same ordering explicit in our own code, where ThreadSanitizer can see it
// (Debian's libkj is not instrumented).
using HandOff = std::shared_ptr<std::atomic<bool>>;

// backend callbacks are std::function, which must be copyable; the fulfiller is move-only, so the
// callback holds it through a shared_ptr. Exactly one copy ever runs.
//
// Still invisible to ThreadSanitizer (tests/tsan.supp): kj's own hand-off of the result, written
// by XThreadFulfiller::fulfill and read by XThreadPafImpl::get (inline in kj's headers, so
// instrumented) and ordered only by the atomic state change inside libkj-async.
backend::CompletionCallback fulfillWith(Fulfiller fulfiller, HandOff handOff) {
  auto shared = std::make_shared<Fulfiller>(kj::mv(fulfiller));
  return [shared, handOff](CUresult status) {
    handOff->store(true, std::memory_order_release);
    (*shared)->fulfill(kj::mv(status));
  };
}

kj::Promise<CUresult> handedOver(kj::Promise<CUresult> promise, HandOff handOff) {
  return promise.then([handOff](CUresult status) {
    (void)handOff->load(std::memory_order_acquire);
    return status;
  });
}

}  // namespace

CallbackOnLoop callbackOnLoop() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
  auto handOff = std::make_shared<std::atomic<bool>>(false);
  return CallbackOnLoop{fulfillWith(kj::mv(paf.fulfiller), handOff),
                        handedOver(kj::mv(paf.promise), handOff)};
}

kj::Promise<CUresult> whenStreamDone(backend::Stream& stream) {
  CallbackOnLoop done = callbackOnLoop();
  CUresult queued = stream.addCallback(std::move(done.callback));
  if (queued != CUDA_SUCCESS) return queued;
  return kj::mv(done.promise);
}

kj::Promise<CUresult> whenEventDone(backend::Event& event) {
  CallbackOnLoop done = callbackOnLoop();
  event.whenComplete(std::move(done.callback));
  return kj::mv(done.promise);
}

kj::Promise<CUresult> firstError(kj::Array<kj::Promise<CUresult>> statuses) {
  return kj::joinPromises(kj::mv(statuses)).then([](kj::Array<CUresult> results) {
    for (CUresult result : results) {
      if (result != CUDA_SUCCESS) return result;
    }
    return CUDA_SUCCESS;
  });
}

}  // namespace gpuproxy::server
