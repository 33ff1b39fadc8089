#pragma once
// Which Kubernetes pod and container a process belongs to, read from its cgroup
// (/proc/PID/cgroup), as the kubelet and the container runtime name them:
//
//   cgroup v2, systemd driver:  0::/kubepods.slice/kubepods-burstable.slice/
//                                  kubepods-burstable-pod<uid_with_underscores>.slice/
//                                  cri-containerd-<64 hex>.scope   (crio-, docker-, ...)
//   cgroupfs driver:            .../kubepods/burstable/pod<uid>/<64 hex>
//   nested (kind):              /docker/<id>/kubepods/besteffort/pod<uid>/<64 hex>
//   inside a cgroup namespace:  0::/../../kubepods.slice/...
//
// Every line is read (on hybrid hosts the v2 line may name the runtime's service while the v1
// lines hold the pod); lines that name different pods make the identity ambiguous, which callers
// must treat as unknown. The text comes from the kernel but its names from the container runtime,
// so it is parsed without trusting its shape (tests/fuzz/pod_identity_fuzz.cpp).

#include <sys/types.h>

#include <string>
#include <string_view>

namespace gpuproxy::server {

struct PodIdentity {
  enum class Kind {
    kNone,       // not in a pod's cgroup (a host process, or a process we cannot see)
    kPod,        // podUid is set; containerId when the cgroup is a container's
    kAmbiguous,  // the lines disagree
  };
  Kind kind = Kind::kNone;
  std::string podUid;       // canonical: lower case, '-' separated
  std::string containerId;  // lower-case hex, as the runtime names it
};

PodIdentity podIdentityFromCgroup(std::string_view cgroupFile);

// /proc/PID/cgroup, or "" when the process is gone.
std::string readCgroupFile(pid_t pid);

}  // namespace gpuproxy::server
