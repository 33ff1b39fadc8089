#pragma once
// The slot profiles the plugin advertises, from the `device_plugin:` section of gpuproxyd's
// tenants file (the daemon ignores that section; one ConfigMap configures both):
//
//   device_plugin:
//     slots_per_gpu: 4              # gpuproxy.io/gpu: each an equal share of its GPU's memory
//     profiles:                     # more resources, each its own slots of every GPU
//       - resource: gpuproxy.io/gpu-4gb
//         slots_per_gpu: 2
//         memory_limit: 4GiB        # per slot
//         weight: 2                 # per slot, default 1
//         class: latency-critical   # or best-effort (default)

#include "client/deviceplugin/slots.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace gpuproxy::deviceplugin {

class ProfilesConfigError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The default profile (with `defaultSlotsPerGpu` unless the file says otherwise) and the file's
// profiles. Throws ProfilesConfigError naming what is wrong; a file without `device_plugin:`
// gives the default profile alone.
std::vector<SlotProfile> parseProfilesConfig(const std::string& yaml,
                                             std::uint32_t defaultSlotsPerGpu);

}  // namespace gpuproxy::deviceplugin
