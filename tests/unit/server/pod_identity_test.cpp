// The pod and container a client's cgroup names, in the forms the kubelet's cgroup drivers and the
// container runtimes produce (and as a process inside a cgroup namespace sees them).
#include "server/session/pod_identity.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::server {
namespace {

constexpr const char* kUid = "6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b";
constexpr const char* kContainer =
    "4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";

TEST(PodIdentity, CgroupV2WithTheSystemdDriverAndContainerd) {
  const PodIdentity identity = podIdentityFromCgroup(
      "0::/kubepods.slice/kubepods-burstable.slice/"
      "kubepods-burstable-pod6f0c2d6e_8a57_4c3b_9a51_2f4a4c1d9e0b.slice/"
      "cri-containerd-4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f.scope\n");
  EXPECT_EQ(identity.kind, PodIdentity::Kind::kPod);
  EXPECT_EQ(identity.podUid, kUid);
  EXPECT_EQ(identity.containerId, kContainer);
}

TEST(PodIdentity, GuaranteedPodsAndCriO) {
  const PodIdentity identity = podIdentityFromCgroup(
      "0::/kubepods.slice/kubepods-pod6f0c2d6e_8a57_4c3b_9a51_2f4a4c1d9e0b.slice/"
      "crio-4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f.scope\n");
  EXPECT_EQ(identity.podUid, kUid);
  EXPECT_EQ(identity.containerId, kContainer);
}

TEST(PodIdentity, TheCgroupfsDriverOnCgroupV1) {
  const PodIdentity identity = podIdentityFromCgroup(
      "12:memory:/kubepods/besteffort/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/"
      "4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f\n"
      "11:cpu,cpuacct:/kubepods/besteffort/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/"
      "4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f\n"
      "0::/system.slice/containerd.service\n");
  EXPECT_EQ(identity.kind, PodIdentity::Kind::kPod);
  EXPECT_EQ(identity.podUid, kUid);
  EXPECT_EQ(identity.containerId, kContainer);
}

TEST(PodIdentity, KindNodesAndCgroupNamespaces) {
  EXPECT_EQ(
      podIdentityFromCgroup("0::/docker/0123456789abcdef0123456789abcdef/kubepods/besteffort/"
                            "pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/"
                            "4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f\n")
          .containerId,
      kContainer);
  const PodIdentity relative = podIdentityFromCgroup(
      "0::/../../kubepods.slice/kubepods-besteffort.slice/"
      "kubepods-besteffort-pod6f0c2d6e_8a57_4c3b_9a51_2f4a4c1d9e0b.slice/"
      "cri-containerd-4e3b8f1a9c2d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f.scope\n");
  EXPECT_EQ(relative.podUid, kUid);
  EXPECT_EQ(relative.containerId, kContainer);
}

TEST(PodIdentity, APodsOwnCgroupHasNoContainer) {
  const PodIdentity identity = podIdentityFromCgroup(
      "0::/kubepods.slice/kubepods-pod6f0c2d6e_8a57_4c3b_9a51_2f4a4c1d9e0b.slice\n");
  EXPECT_EQ(identity.kind, PodIdentity::Kind::kPod);
  EXPECT_EQ(identity.podUid, kUid);
  EXPECT_EQ(identity.containerId, "");
}

TEST(PodIdentity, HostProcessesAreInNoPod) {
  for (const char* text :
       {"0::/user.slice/user-1000.slice/session-3.scope\n", "0::/\n", "", "garbage",
        "0::/kubepods.slice\n", "0::/system.slice/podman-1234.scope\n",
        "0::/kubepods/pod6f0c2d6e-8a57-4c3b-9a51\n",
        "0::/apod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b\n",
        "0::/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0bx\n"}) {
    EXPECT_EQ(podIdentityFromCgroup(text).kind, PodIdentity::Kind::kNone) << text;
  }
}

TEST(PodIdentity, LinesThatNameDifferentPodsAreAmbiguous) {
  EXPECT_EQ(podIdentityFromCgroup("1:cpu:/kubepods/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/abc\n"
                                  "2:memory:/kubepods/pod00000000-8a57-4c3b-9a51-2f4a4c1d9e0b\n")
                .kind,
            PodIdentity::Kind::kAmbiguous);
  EXPECT_EQ(podIdentityFromCgroup("1:cpu:/kubepods/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/"
                                  "aaaaaaaaaaaaaaaa\n"
                                  "2:memory:/kubepods/pod6f0c2d6e-8a57-4c3b-9a51-2f4a4c1d9e0b/"
                                  "bbbbbbbbbbbbbbbb\n")
                .kind,
            PodIdentity::Kind::kAmbiguous);
}

TEST(PodIdentity, UpperCaseAndUnderscoresAreCanonicalised) {
  const PodIdentity identity = podIdentityFromCgroup(
      "0::/kubepods/pod6F0C2D6E_8A57_4C3B_9A51_2F4A4C1D9E0B/ABCDEF0123456789\n");
  EXPECT_EQ(identity.podUid, kUid);
  EXPECT_EQ(identity.containerId, "abcdef0123456789");
}

}  // namespace
}  // namespace gpuproxy::server
