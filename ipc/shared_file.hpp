#pragma once
// A protocol::SharedFile capability: its one content is a file descriptor, which Cap'n Proto
// passes with SCM_RIGHTS when the capability is sent (Capability::Server::getFd). It owns the
// descriptor, so it may outlive whoever made it while Cap'n Proto is still sending it.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/unique_fd.hpp"

#include <kj/common.h>

#include <utility>

namespace gpuproxy::ipc {

class SharedFileServer final : public protocol::SharedFile::Server {
public:
  explicit SharedFileServer(UniqueFd fd) : fd_(std::move(fd)) {}

  kj::Maybe<int> getFd() override { return fd_.get(); }

private:
  UniqueFd fd_;
};

}  // namespace gpuproxy::ipc
