#pragma once
// gpuproxyd's whole life: pick a backend, open every GPU, listen on the client and admin sockets,
// serve until SIGTERM/SIGINT, then detach every client, reclaim what they held and remove the
// sockets.

#include "server/daemon/daemon_options.hpp"

namespace gpuproxy::server {

// Returns the process exit code: 0 after a clean shutdown, 1 when the environment does not allow
// starting (the reason has been logged in one line).
int runDaemon(const DaemonOptions& options);

}  // namespace gpuproxy::server
