#pragma once
// Unix-domain socket helpers shared by the daemon, the stub and gpuproxyctl.

#include <sys/types.h>

#include "ipc/unique_fd.hpp"

#include <string>
#include <string_view>
#include <vector>

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

// A Unix socket listening at a path. It remembers the directories it had to create for the path,
// so that closing it leaves the file system as it found it: a configuration that is refused
// halfway, or a tenant that is removed, leaves no socket and no empty directory behind.
class ListeningSocket {
public:
  // Prepares `path` (prepareListeningPath), binds, sets `mode` on the socket file and listens.
  // Throws std::runtime_error with a one-line reason; nothing is left behind then.
  static ListeningSocket open(const std::string& path, mode_t mode);

  ListeningSocket() = default;
  ~ListeningSocket() { withdraw(); }
  ListeningSocket(ListeningSocket&& other) noexcept;
  ListeningSocket& operator=(ListeningSocket&& other) noexcept;
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;

  const std::string& path() const { return path_; }
  // The listening descriptor, or -1 once released or withdrawn.
  int fd() const { return fd_; }
  // Hands the descriptor to an event loop, which closes it; the path stays this object's.
  int releaseFd();
  // Closes the descriptor if still held, removes the socket file and then every directory this
  // socket created, deepest first, as long as it is empty.
  void withdraw();
  // The directories this socket created stay when it is withdrawn: something outside this
  // process holds them (a pod's mount) and the next listener at this path must be in the same.
  void keepDirectories() { createdDirectories_.clear(); }

private:
  int fd_ = -1;
  std::string path_;
  std::vector<std::string> createdDirectories_;  // outermost first
};

// A Unix stream socket connected to `path` (close-on-exec). Throws std::system_error with the
// kernel's reason when it cannot connect, std::invalid_argument when the path cannot be one.
// The one way every gpuproxy program (the stub, gpuproxyctl's tests, the benchmarks) connects.
UniqueFd connectUnixSocket(const std::string& path);

// Longest path sockaddr_un holds (107 bytes on Linux).
std::size_t maxSocketPathLength();

// The process name the kernel reports for `pid` (/proc/PID/comm), or "" if it is gone.
std::string processName(pid_t pid);

}  // namespace gpuproxy::ipc
