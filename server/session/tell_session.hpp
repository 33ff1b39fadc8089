#pragma once
// How what runs beside a session (a GPU's executor, a ring) tells the session something: by a
// message to the session's thread, where the session is used only if it is still alive, since
// the sender may outlive it (an executor's tasks end later, on its GPU). Nobody waits for the
// answer; a message that cannot be delivered is logged.

#include <kj/async.h>
#include <kj/debug.h>

#include <memory>
#include <utility>

namespace gpuproxy::server {

// Runs `work()` on `sessionThread` unless `sessionAlive` no longer holds true there. `what` names
// the message in the log if it fails.
template <typename Work>
void tellSession(const kj::Executor& sessionThread, std::weak_ptr<const bool> sessionAlive,
                 Work work, const char* what) {
  sessionThread
      .executeAsync([alive = std::move(sessionAlive), work = std::move(work)]() mutable {
        const std::shared_ptr<const bool> live = alive.lock();
        if (live && *live) work();
      })
      .detach([what](kj::Exception&& exception) { KJ_LOG(ERROR, what, exception); });
}

}  // namespace gpuproxy::server
