#include "server/session/pod_identity.hpp"

#include <array>
#include <fstream>
#include <sstream>

namespace gpuproxy::server {

namespace {

bool isPunctuation(char c) {
  return c == '/' || c == '-' || c == '_' || c == '.' || c == ':' || c == '@';
}

bool isHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// A pod UID at the start of `text` (8-4-4-4-12 hex digits, separated by '-' or '_'), canonical,
// or "" when there is none.
std::string podUidAt(std::string_view text) {
  constexpr std::array<std::size_t, 5> kGroups{8, 4, 4, 4, 12};
  std::string uid;
  std::size_t at = 0;
  for (std::size_t group = 0; group < kGroups.size(); ++group) {
    if (group > 0) {
      if (at >= text.size() || (text[at] != '-' && text[at] != '_')) return "";
      uid += '-';
      ++at;
    }
    for (std::size_t i = 0; i < kGroups[group]; ++i, ++at) {
      if (at >= text.size() || !isHex(text[at])) return "";
      uid += lower(text[at]);
    }
  }
  // The UID must end there: "pod<uid>.slice", "pod<uid>/...", or the end of the path.
  if (at < text.size() && !isPunctuation(text[at])) return "";
  return uid;
}

// The container id that ends `path` after the pod: the last run of hex digits of its last
// component, once a ".scope" suffix is gone, if it is long enough to be one.
std::string containerIdAtEnd(std::string_view path) {
  constexpr std::size_t kMinIdLength = 12;
  constexpr std::size_t kMaxIdLength = 128;
  constexpr std::string_view kScope = ".scope";
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.size() >= kScope.size() && path.substr(path.size() - kScope.size()) == kScope) {
    path.remove_suffix(kScope.size());
  }
  std::size_t begin = path.size();
  while (begin > 0 && !isPunctuation(path[begin - 1])) --begin;
  std::string_view id = path.substr(begin);
  if (id.size() < kMinIdLength || id.size() > kMaxIdLength) return "";
  std::string out;
  for (char c : id) {
    if (!isHex(c)) return "";
    out += lower(c);
  }
  return out;
}

// The pod (and container) one cgroup path names; kind kNone when it names none.
PodIdentity identityOfPath(std::string_view path) {
  PodIdentity identity;
  // The last "pod<uid>" in the path is the pod's own cgroup (a kind node's path names its node
  // container first, with no "pod" before it).
  for (std::size_t at = path.find("pod"); at != std::string_view::npos;
       at = path.find("pod", at + 1)) {
    if (at == 0 || !isPunctuation(path[at - 1])) continue;
    std::string uid = podUidAt(path.substr(at + 3));
    if (uid.empty()) continue;
    identity.kind = PodIdentity::Kind::kPod;
    identity.podUid = uid;
    // What follows the pod's own component is the container's cgroup, if anything.
    std::string_view rest = path.substr(at + 3 + 36);
    std::size_t slash = rest.find('/');
    identity.containerId =
        slash == std::string_view::npos ? "" : containerIdAtEnd(rest.substr(slash + 1));
  }
  return identity;
}

}  // namespace

PodIdentity podIdentityFromCgroup(std::string_view cgroupFile) {
  PodIdentity found;
  while (!cgroupFile.empty()) {
    std::size_t end = cgroupFile.find('\n');
    std::string_view line = cgroupFile.substr(0, end);
    cgroupFile = end == std::string_view::npos ? std::string_view() : cgroupFile.substr(end + 1);
    // hierarchy-ID:controllers:path; the path may itself contain ':'.
    std::size_t first = line.find(':');
    std::size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    PodIdentity identity = identityOfPath(line.substr(second + 1));
    if (identity.kind != PodIdentity::Kind::kPod) continue;
    if (found.kind == PodIdentity::Kind::kNone) {
      found = std::move(identity);
      continue;
    }
    if (found.podUid != identity.podUid) return PodIdentity{PodIdentity::Kind::kAmbiguous, "", ""};
    if (found.containerId.empty()) {
      found.containerId = identity.containerId;
    } else if (!identity.containerId.empty() && identity.containerId != found.containerId) {
      return PodIdentity{PodIdentity::Kind::kAmbiguous, "", ""};
    }
  }
  return found;
}

std::string readCgroupFile(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace gpuproxy::server
