#pragma once
// The device plugin's model of what it advertises: each GPU of the daemon is cut into slots of a
// profile (an extended resource with a memory limit, a weight and a class per slot), and an
// allocation is a set of slots of one GPU, which becomes one tenant of gpuproxyd. Pure logic:
// no gRPC, no daemon.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gpuproxy::deviceplugin {

// The extended resource of the default profile (what a pod asks for in `resources.limits`).
inline constexpr std::string_view kDefaultResourceName = "gpuproxy.io/gpu";
// The device plugin API version the kubelet must support.
inline constexpr std::string_view kDevicePluginApiVersion = "v1beta1";
// Where an allocation's socket directory and the stub appear inside the container. CUDA images
// put /usr/local/nvidia/lib64 on LD_LIBRARY_PATH (deploy/README.md, "Device-plugin mode"), so
// the stub mounted there is the libcuda.so.1 the application loads, with no change to the pod.
inline constexpr std::string_view kContainerSocketDirectory = "/run/gpuproxy";
inline constexpr std::string_view kContainerSocket = "/run/gpuproxy/gpuproxy.sock";
inline constexpr std::string_view kContainerStubDirectory = "/usr/local/nvidia/lib64";

struct SlotProfile {
  std::string resourceName{kDefaultResourceName};
  std::uint32_t slotsPerGpu = 4;
  // Memory limit of one slot; nullopt: an equal share of the GPU (memory / slotsPerGpu).
  std::optional<std::uint64_t> memoryPerSlot;
  std::uint32_t weightPerSlot = 1;
  bool latencyCritical = false;
};

// A GPU of the daemon, as its status reports it.
struct Gpu {
  std::uint32_t index = 0;
  std::uint64_t memoryTotal = 0;
};

struct Slot {
  std::uint32_t gpu = 0;
  std::uint32_t slot = 0;
};

// A slot's device id as the kubelet sees it: "gpu<index>-slot<n>".
std::string slotId(Slot slot);
std::optional<Slot> parseSlotId(std::string_view id);

// Why a profile cannot be used (an empty string when it can): a resource name the kubelet
// refuses, no slots, a weight out of the daemon's range.
std::string profileError(const SlotProfile& profile);

// The socket file name the plugin serves a profile on, in the kubelet's directory: unique per
// resource ("gpuproxy.io/gpu-4gb" -> "gpuproxy-gpu-4gb.sock").
std::string endpointName(const SlotProfile& profile);

// Every slot of `profile` on `gpus`, in device-id order.
std::vector<std::string> advertisedSlots(const SlotProfile& profile, const std::vector<Gpu>& gpus);

// An allocation the kubelet asked for, checked.
struct Allocation {
  std::uint32_t gpu = 0;
  std::vector<std::string> deviceIds;  // sorted
};

// Checks the device ids of one container's request against the profile and the GPUs: each a
// slot that exists, none twice, all of one GPU. Returns the allocation or why it is refused, in
// a sentence for the kubelet's event.
std::variant<Allocation, std::string> validateAllocation(const SlotProfile& profile,
                                                         const std::vector<Gpu>& gpus,
                                                         const std::vector<std::string>& deviceIds);

// The slots the plugin would like the kubelet to give a container asking for `size` of them:
// all of `mustInclude`, then slots of the same GPU. Without `mustInclude`, the GPU with the
// fewest free slots that still holds `size` (whole GPUs stay free for large requests); when no
// GPU holds that many, the one with the most, then others (Allocate refuses those, saying why).
std::vector<std::string> preferredAllocation(const std::vector<std::string>& available,
                                             const std::vector<std::string>& mustInclude,
                                             std::size_t size);

// The limits of an allocation's tenant: its slots' memory, weights and class added up.
struct AllocationLimits {
  std::uint64_t memoryLimit = 0;
  std::uint32_t weight = 1;
  bool latencyCritical = false;
};
AllocationLimits limitsOf(const SlotProfile& profile, const Gpu& gpu, std::size_t slots);

// The tenant name of an allocation: the same resource and device ids always give the same name,
// so that the kubelet asking again for the same slots (an init container's slots reused by the
// pod's next container) finds the tenant it made before.
std::string tenantName(std::string_view resourceName, const std::vector<std::string>& sortedIds);

}  // namespace gpuproxy::deviceplugin
