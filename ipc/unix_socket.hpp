#pragma once
// Unix-domain socket helpers shared by the daemon, the stub and gpuproxyctl.

#include <sys/types.h>

#include "ipc/unique_fd.hpp"

#include <string>
#include <string_view>

namespace gpuproxy::ipc {

// Who is on the other end of a connected Unix socket, as the kernel says (SO_PEERCRED): nothing
// the peer sends can change it.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Throws std::system_error when the kernel will not say (not a Unix socket).
PeerCredentials peerCredentials(int socketFd);

// Makes `path` ready to listen on: creates missing parent directories and removes a stale socket
// left by a dead daemon. Throws std::runtime_error with a one-line reason when the path is too long
// for sockaddr_un, is not a socket, or another daemon is still answering on it.
void prepareListeningPath(const std::string& path);

// A Unix stream socket connected to `path` (close-on-exec). Throws std::system_error with the
// kernel's reason when it cannot connect, std::invalid_argument when the path cannot be one.
// The one way every gpuproxy program (the stub, gpuproxyctl's tests, the benchmarks) connects.
UniqueFd connectUnixSocket(const std::string& path);

// Longest path sockaddr_un holds (107 bytes on Linux).
std::size_t maxSocketPathLength();

// The process name the kernel reports for `pid` (/proc/PID/comm), or "" if it is gone.
std::string processName(pid_t pid);

}  // namespace gpuproxy::ipc
