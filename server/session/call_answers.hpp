#pragma once
// How a Session call is answered, in the shapes most calls take: routed to the caller's state on
// one GPU (a GpuClient, null when the call names none), then a CUresult now, a created thing now,
// or a CUresult once the GPU work the call waits for is done. Shared by the files that implement
// ClientSession.

#include "server/gpu/gpu_client.hpp"

#include <kj/async.h>

namespace gpuproxy::server {

// Answers `results` with `promise`'s CUresult once it resolves.
template <typename Context>
kj::Promise<void> answerLater(Context context, kj::Promise<CUresult> promise) {
  return promise.then(
      [context](CUresult result) mutable { context.getResults().setResult(result); });
}

// The shape of most calls: `client` is the caller's state on the GPU the call names, null when
// there is none (answered with `missing`); otherwise `operation(*client)` gives the CUresult, now
// (answerNow) or once the GPU work it waits for is done (answerWhenDone).
template <typename Context, typename Operation>
kj::Promise<void> answerNow(Context& context, GpuClient* client, CUresult missing,
                            Operation&& operation) {
  context.getResults().setResult(client == nullptr ? missing : operation(*client));
  return kj::READY_NOW;
}

// For calls that create something: `create(*client)` gives a backend::Result whose value, on
// success, `store(results, value)` puts into the answer.
template <typename Context, typename Create, typename Store>
kj::Promise<void> answerCreated(Context& context, GpuClient* client, CUresult missing,
                                Create&& create, Store&& store) {
  auto results = context.getResults();
  if (client == nullptr) {
    results.setResult(missing);
    return kj::READY_NOW;
  }
  auto created = create(*client);
  results.setResult(created.code());
  if (created.ok()) store(results, created.value());
  return kj::READY_NOW;
}

template <typename Context, typename Operation>
kj::Promise<void> answerWhenDone(Context& context, GpuClient* client, CUresult missing,
                                 Operation&& operation) {
  if (client == nullptr) {
    context.getResults().setResult(missing);
    return kj::READY_NOW;
  }
  return answerLater(context, operation(*client));
}

}  // namespace gpuproxy::server
