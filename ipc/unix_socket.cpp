#include "ipc/unix_socket.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace gpuproxy::ipc {

PeerCredentials peerCredentials(int socketFd) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(socketFd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    throw std::system_error(errno, std::generic_category(), "getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{credentials.pid, credentials.uid, credentials.gid};
}

std::size_t maxSocketPathLength() {
  return sizeof(sockaddr_un::sun_path) - 1;
}

UniqueFd connectUnixSocket(const std::string& path) {
  if (path.empty() || path.size() > maxSocketPathLength()) {
    throw std::invalid_argument("socket path '" + path + "' is empty or longer than " +
                                std::to_string(maxSocketPathLength()) + " bytes");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  int status;
  do {
    status = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  } while (status != 0 && errno == EINTR);
  if (status != 0) throw std::system_error(errno, std::generic_category(), "connect to " + path);
  return fd;
}

namespace {

// True when something accepts connections on `path` right now.
bool someoneListens(const std::string& path) {
  try {
    connectUnixSocket(path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Creates the missing directories above `path`; returns those it created, outermost first. On
// failure removes what it created and throws.
std::vector<std::string> createParentDirectories(const std::string& path) {
  std::vector<std::string> created;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::vector<std::filesystem::path> missing;
  for (auto directory = parent; !directory.empty() && directory != directory.root_path();
       directory = directory.parent_path()) {
    std::error_code ignored;
    if (std::filesystem::exists(directory, ignored)) break;
    missing.push_back(directory);
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) {
      const int error = errno;
      for (auto done = created.rbegin(); done != created.rend(); ++done) ::rmdir(done->c_str());
      throw std::runtime_error("cannot create directory '" + it->string() +
                               "': " + std::strerror(error));
    }
    created.push_back(it->string());
  }
  return created;
}

void checkSocketPathLength(const std::string& path) {
  if (path.empty()) throw std::runtime_error("socket path is empty");
  if (path.size() > maxSocketPathLength()) {
    throw std::runtime_error("socket path '" + path + "' is longer than " +
                             std::to_string(maxSocketPathLength()) + " bytes");
  }
}

// Removes a stale socket at `path`; throws when something else is there or a daemon answers.
void clearStaleSocket(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return;  // nothing there: fine
  if (!S_ISSOCK(info.st_mode)) {
    throw std::runtime_error("'" + path + "' exists and is not a socket");
  }
  if (someoneListens(path)) {
    throw std::runtime_error("another daemon is already listening on '" + path + "'");
  }
  ::unlink(path.c_str());
}

}  // namespace

void prepareListeningPath(const std::string& path) {
  checkSocketPathLength(path);
  createParentDirectories(path);
  clearStaleSocket(path);
}

ListeningSocket ListeningSocket::open(const std::string& path, mode_t mode) {
  checkSocketPathLength(path);
  ListeningSocket socket;
  // path_ is set only once the socket file is ours: withdraw() removes only what we made.
  socket.createdDirectories_ = createParentDirectories(path);
  try {
    clearStaleSocket(path);
    socket.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket.fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    if (::bind(socket.fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      throw std::runtime_error("cannot listen on '" + path + "': " + std::strerror(errno));
    }
    socket.path_ = path;
    if (::chmod(path.c_str(), mode) != 0) {
      throw std::runtime_error("cannot set permissions on '" + path + "': " + std::strerror(errno));
    }
    if (::listen(socket.fd_, SOMAXCONN) != 0) {
      throw std::runtime_error("cannot listen on '" + path + "': " + std::strerror(errno));
    }
  } catch (...) {
    socket.withdraw();
    throw;
  }
  return socket;
}

ListeningSocket::ListeningSocket(ListeningSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      createdDirectories_(std::move(other.createdDirectories_)) {
  other.path_.clear();
  other.createdDirectories_.clear();
}

ListeningSocket& ListeningSocket::operator=(ListeningSocket&& other) noexcept {
  if (this != &other) {
    withdraw();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    createdDirectories_ = std::move(other.createdDirectories_);
    other.path_.clear();
    other.createdDirectories_.clear();
  }
  return *this;
}

int ListeningSocket::releaseFd() {
  return std::exchange(fd_, -1);
}

void ListeningSocket::withdraw() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
  // rmdir refuses a directory that is not empty: whatever someone else put there stays.
  for (auto it = createdDirectories_.rbegin(); it != createdDirectories_.rend(); ++it) {
    ::rmdir(it->c_str());
  }
  createdDirectories_.clear();
}

std::string processName(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace gpuproxy::ipc
