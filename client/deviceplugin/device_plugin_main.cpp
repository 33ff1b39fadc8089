// gpuproxy-device-plugin: advertises slots of gpuproxyd's GPUs to the kubelet as extended
// resources and makes a tenant of gpuproxyd for every allocation (client/deviceplugin/).
#include "client/deviceplugin/daemon_admin.hpp"
#include "client/deviceplugin/device_plugin_service.hpp"
#include "client/deviceplugin/plugin_endpoint.hpp"
#include "client/deviceplugin/pod_resources.hpp"
#include "client/deviceplugin/profiles_config.hpp"
#include "client/deviceplugin/slots.hpp"
#include "protocol/limits.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <ctime>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace {

using namespace gpuproxy::deviceplugin;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the plugin looks whether the kubelet removed its sockets.
constexpr milliseconds kTick{200};

// One profile at the kubelet, with what the loop remembers about it.
struct Registration {
  std::unique_ptr<PluginEndpoint> endpoint;
  bool registered = false;
  std::string lastError;  // logged once, not on every retry
};

// Waits up to `timeout` for SIGTERM or SIGINT (blocked in every thread); returns whether one came.
bool stopRequested(const sigset_t& signals, milliseconds timeout) {
  timespec wait{static_cast<time_t>(timeout.count() / 1000),
                static_cast<long>((timeout.count() % 1000) * 1000000)};
  return ::sigtimedwait(&signals, nullptr, &wait) > 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpuproxy-device-plugin: gpuproxyd's GPU slots as Kubernetes extended resources"};
  std::string adminSocket = gpuproxy::protocol::kDefaultAdminSocket;
  std::string kubeletDirectory = "/var/lib/kubelet/device-plugins";
  std::string podResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  AllocationSettings settings{"/run/gpuproxy/alloc", "/run/gpuproxy/lib"};
  std::uint32_t slotsPerGpu = 4;
  std::string configFile;
  std::uint64_t registerTimeoutMs = 10000;
  std::uint64_t daemonPollMs = 2000;
  std::uint64_t sweepIntervalMs = 10000;
  std::uint64_t sweepGraceMs = 60000;
  std::string logLevel = "info";
  app.add_option("--admin-socket", adminSocket, "gpuproxyd's admin socket")->capture_default_str();
  app.add_option("--kubelet-directory", kubeletDirectory,
                 "the kubelet's device plugin directory (holds kubelet.sock)")
      ->capture_default_str();
  app.add_option("--pod-resources-socket", podResourcesSocket,
                 "the kubelet's PodResources socket, for pod names and removing allocations of "
                 "pods that are gone; empty: neither")
      ->capture_default_str();
  app.add_option("--allocation-root", settings.allocationRoot,
                 "host directory under which each allocation gets its socket directory")
      ->capture_default_str();
  app.add_option("--stub-directory", settings.stubDirectory,
                 "host directory holding the stub (libcuda.so.1), mounted read-only into pods at " +
                     std::string(kContainerStubDirectory))
      ->capture_default_str();
  app.add_option("--slots-per-gpu", slotsPerGpu,
                 "slots of " + std::string(kDefaultResourceName) +
                     " per GPU, each an equal share of its memory (the config file may say "
                     "otherwise)")
      ->capture_default_str();
  app.add_option("--config", configFile,
                 "gpuproxyd's tenants file: its `device_plugin:` section gives the slot profiles "
                 "(resources) to advertise");
  app.add_option("--register-timeout-ms", registerTimeoutMs,
                 "how long to wait for the kubelet to answer Register")
      ->capture_default_str();
  app.add_option("--daemon-poll-ms", daemonPollMs, "how often to ask gpuproxyd for its GPUs")
      ->capture_default_str();
  app.add_option("--pod-resources-interval-ms", sweepIntervalMs,
                 "how often to look for pods that are gone")
      ->capture_default_str();
  app.add_option("--pod-resources-grace-ms", sweepGraceMs,
                 "how long an allocation may go unlisted by PodResources before it is removed")
      ->capture_default_str();
  app.add_option("--log-level", logLevel, "trace, debug, info, warn, error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_default_logger(spdlog::stderr_color_mt("gpuproxy-device-plugin"));
  spdlog::set_level(spdlog::level::from_str(logLevel));

  std::vector<SlotProfile> profiles;
  try {
    std::string yaml;
    if (!configFile.empty()) {
      std::ifstream file(configFile);
      if (!file) throw ProfilesConfigError("cannot read " + configFile);
      std::ostringstream text;
      text << file.rdbuf();
      yaml = text.str();
    }
    profiles = parseProfilesConfig(yaml, slotsPerGpu);
  } catch (const ProfilesConfigError& error) {
    std::fprintf(stderr, "gpuproxy-device-plugin: %s%s\n",
                 configFile.empty() ? "" : (configFile + ": ").c_str(), error.what());
    return 2;
  }
  std::set<std::string> resources;
  for (const auto& profile : profiles) {
    if (auto error = profileError(profile); !error.empty()) {
      std::fprintf(stderr, "gpuproxy-device-plugin: %s\n", error.c_str());
      return 2;
    }
    if (!resources.insert(profile.resourceName).second) {
      std::fprintf(stderr, "gpuproxy-device-plugin: resource %s is given twice\n",
                   profile.resourceName.c_str());
      return 2;
    }
  }

  // SIGTERM and SIGINT are taken by the main loop only: blocked here, before gRPC starts threads,
  // which inherit the mask.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGTERM);
  sigaddset(&stopSignals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  DaemonAdmin admin(adminSocket);
  std::mutex adminMutex;
  Inventory inventory;
  AllocationLedger ledger;
  std::vector<Registration> registrations;
  for (const auto& profile : profiles) {
    auto make = [&, profile] {
      return std::make_unique<DevicePluginService>(profile, settings, admin, adminMutex, inventory,
                                                   ledger);
    };
    Registration registration;
    registration.endpoint = std::make_unique<PluginEndpoint>(profile, make, kubeletDirectory);
    registrations.push_back(std::move(registration));
  }
  std::unique_ptr<PodResourcesSweep> sweep;
  if (!podResourcesSocket.empty()) {
    sweep = std::make_unique<PodResourcesSweep>(podResourcesSocket, resources, admin, adminMutex,
                                                ledger, milliseconds(sweepGraceMs));
  }
  spdlog::info("gpuproxy-device-plugin: gpuproxyd at {}, kubelet at {}, {} resource(s)",
               adminSocket, kubeletDirectory, profiles.size());

  auto nextDaemonPoll = Clock::now();
  auto nextSweep = Clock::now() + milliseconds(sweepIntervalMs);
  std::string daemonError;
  std::string sweepError;
  bool daemonSeen = false;
  for (;;) {
    if (Clock::now() >= nextDaemonPoll) {
      nextDaemonPoll = Clock::now() + milliseconds(daemonPollMs);
      try {
        DaemonSnapshot snapshot;
        {
          std::lock_guard lock(adminMutex);
          snapshot = admin.status();
        }
        if (inventory.update(snapshot.gpus, true) || !daemonError.empty() || !daemonSeen) {
          spdlog::info("gpuproxyd answers: {} GPU(s) on its {} backend", snapshot.gpus.size(),
                       snapshot.backend);
        }
        daemonSeen = true;
        daemonError.clear();
      } catch (const DaemonUnavailable& error) {
        if (daemonError != error.what()) {
          spdlog::error("{}{}", error.what(),
                        daemonSeen ? "; its slots are unhealthy until it answers"
                                   : "; registering with the kubelet once it answers");
        }
        daemonError = error.what();
        inventory.update(inventory.view().gpus, false);
      }
    }

    // Register only once the daemon's GPUs are known: a resource with no slots helps no one.
    if (daemonSeen) {
      for (auto& registration : registrations) {
        auto& endpoint = *registration.endpoint;
        if (registration.registered && !endpoint.lost()) continue;
        if (registration.registered) {
          spdlog::warn("{}: {} is gone (the kubelet restarted): serving and registering again",
                       endpoint.resourceName(), endpoint.socketPath());
          registration.registered = false;
        }
        std::string error = endpoint.start();
        if (error.empty()) {
          error = endpoint.registerWithKubelet(milliseconds(registerTimeoutMs));
        }
        if (error.empty()) {
          registration.registered = true;
          registration.lastError.clear();
        } else {
          if (error != registration.lastError) {
            spdlog::error("{}: {}; trying again", endpoint.resourceName(), error);
          }
          registration.lastError = error;
          endpoint.stop();
        }
      }
    }

    if (sweep && Clock::now() >= nextSweep) {
      nextSweep = Clock::now() + milliseconds(sweepIntervalMs);
      auto error = sweep->sweep();
      if (!error.empty() && error != sweepError) spdlog::warn("{}", error);
      sweepError = error;
    }

    if (stopRequested(stopSignals, kTick)) break;
  }
  spdlog::info("gpuproxy-device-plugin: stopping; allocations stay with gpuproxyd");
  for (auto& registration : registrations) registration.endpoint->stop();
  return 0;
}
