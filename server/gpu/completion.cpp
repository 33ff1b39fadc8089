#include "server/gpu/completion.hpp"

#include <utility>

namespace gpuproxy::server {

namespace {

using Fulfiller = kj::Own<kj::CrossThreadPromiseFulfiller<CUresult>>;

// backend callbacks are std::function, which must be copyable; the fulfiller is move-only, so the
// callback holds it through a shared_ptr. Exactly one copy ever runs.
//
// Invisible to ThreadSanitizer (tests/tsan.supp): the backend's thread writes the result into
// kj's cross-thread promise (XThreadFulfiller::fulfill, inline in kj's headers, so instrumented)
// and then publishes it with an atomic state change inside libkj-async; the event-loop thread
// reads the result (XThreadPafImpl::get) only after seeing that state inside libkj-async. That
// release/acquire pair is correct, but Debian's libkj is not built with -fsanitize=thread, so TSan
// sees the two accesses without the ordering between them.
backend::CompletionCallback fulfillWith(Fulfiller fulfiller) {
  auto shared = std::make_shared<Fulfiller>(kj::mv(fulfiller));
  return [shared](CUresult status) { (*shared)->fulfill(kj::mv(status)); };
}

}  // namespace

kj::Promise<CUresult> whenStreamDone(backend::Stream& stream) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
  CUresult queued = stream.addCallback(fulfillWith(kj::mv(paf.fulfiller)));
  if (queued != CUDA_SUCCESS) return queued;
  return kj::mv(paf.promise);
}

kj::Promise<CUresult> whenEventDone(backend::Event& event) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
  event.whenComplete(fulfillWith(kj::mv(paf.fulfiller)));
  return kj::mv(paf.promise);
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
