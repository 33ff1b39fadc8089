#pragma once
// Every live client connection, by the pid that opened it, so that the daemon can end one on its
// own initiative: when that process exits while a child that inherited the socket keeps it open
// (its pidfd becomes readable), or when an operator evicts it. Ending a connection drops its
// sessions, which takes the same teardown path as a client that crashed.

#include "server/tenant/tenant.hpp"

#include <kj/async.h>
#include <sys/types.h>

#include <cstdint>
#include <map>

namespace gpuproxy::server {

class ConnectionRegistry {
public:
  // Registers a connection of `pid`; the returned promise resolves when someone asks to end it.
  // The registration lasts until `forget(id)`.
  struct Registration {
    std::uint64_t id;
    kj::Promise<void> endRequested;
  };
  Registration add(pid_t pid, TenantId tenant = 0);
  void forget(std::uint64_t id);
  // Asks every connection of `pid` to end; returns how many there were.
  std::uint32_t end(pid_t pid);
  // Asks every connection that came through `tenant`'s socket to end; returns how many.
  std::uint32_t endTenant(TenantId tenant);
  // Asks one connection to end (a client that broke the data-plane format).
  void endConnection(std::uint64_t id);

private:
  struct Entry {
    pid_t pid;
    TenantId tenant;
    kj::Own<kj::PromiseFulfiller<void>> ender;
  };
  std::uint64_t nextId_ = 1;
  std::map<std::uint64_t, Entry> entries_;
};

}  // namespace gpuproxy::server
