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

}  // namespace

void prepareListeningPath(const std::string& path) {
  if (path.empty()) throw std::runtime_error("socket path is empty");
  if (path.size() > maxSocketPathLength()) {
    throw std::runtime_error("socket path '" + path + "' is longer than " +
                             std::to_string(maxSocketPathLength()) + " bytes");
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      throw std::runtime_error("cannot create directory '" + parent.string() +
                               "': " + error.message());
    }
  }
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

std::string processName(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace gpuproxy::ipc
