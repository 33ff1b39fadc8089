// Fuzz target: /proc/PID/cgroup of a connecting client, whose path names come from the container
// runtime.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/session/pod_identity.hpp"

namespace server = gpuproxy::server;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const server::PodIdentity identity = server::podIdentityFromCgroup(text);
  // A pod identity always has a canonical UID; nothing else carries one.
  if (identity.kind == server::PodIdentity::Kind::kPod) {
    if (identity.podUid.size() != 36) std::abort();
    for (char c : identity.podUid) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) std::abort();
    }
  } else if (!identity.podUid.empty() || !identity.containerId.empty()) {
    std::abort();
  }
  for (char c : identity.containerId) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) std::abort();
  }
  return 0;
}
