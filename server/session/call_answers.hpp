#pragma once
// How a Session call is answered, in the shapes most calls take: routed to the caller's state on
// one GPU (a GpuClient, null when the call names none), whose operation runs on that GPU as a
// message (server/gpu/gpu_messages.hpp), then answered on the session's thread with the CUresult
// it gives, or with what it created. Shared by the files that implement ClientSession.
//
// An operation is a message: it captures values (handles, sizes, strings copied out of the
// call's parameters), never references into the call or the session, and it gives back values.

#include "server/gpu/gpu_client.hpp"
#include "server/gpu/gpu_messages.hpp"

#include <kj/async.h>

#include <utility>

namespace gpuproxy::server {

// Answers `results` with `promise`'s CUresult once it resolves.
template <typename Context>
kj::Promise<void> answerLater(Context context, kj::Promise<CUresult> promise) {
  return promise.then(
      [context](CUresult result) mutable { context.getResults().setResult(result); });
}

// The shape of most calls: `client` is the caller's state on the GPU the call names, null when
// there is none (answered with `missing`); otherwise `operation(*client)`, on that GPU, gives the
// CUresult, as a value or as a promise that resolves once the GPU work it waits for is done.
template <typename Context, typename Operation>
kj::Promise<void> answerFromGpu(Context context, GpuClient* client, CUresult missing,
                                Operation operation) {
  if (client == nullptr) {
    context.getResults().setResult(missing);
    return kj::READY_NOW;
  }
  return answerLater(context, onGpu(*client, std::move(operation)));
}

// For calls that create something: `create(*client)`, on the client's GPU, gives a
// backend::Result whose value, on success, `store(results, value)` puts into the answer here.
template <typename Context, typename Create, typename Store>
kj::Promise<void> answerCreated(Context context, GpuClient* client, CUresult missing, Create create,
                                Store store) {
  if (client == nullptr) {
    context.getResults().setResult(missing);
    return kj::READY_NOW;
  }
  return onGpu(*client, std::move(create))
      .then([context, store = std::move(store)](auto created) mutable {
        auto results = context.getResults();
        results.setResult(created.code());
        if (created.ok()) store(results, created.value());
      });
}

}  // namespace gpuproxy::server
