#include "server/metrics/prometheus_text.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace gpuproxy::server {

namespace {

using Label = std::pair<std::string_view, std::string_view>;

std::string_view viewOf(capnp::Text::Reader text) {
  return {text.cStr(), text.size()};
}

// HELP text escapes only backslash and newline (a quote is literal there).
std::string escapeHelp(std::string_view text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string formatUnsigned(std::uint64_t value) {
  return std::to_string(value);
}

// Exact decimal seconds from nanoseconds: going through a double would print noise digits.
std::string formatNanosAsSeconds(std::uint64_t nanos) {
  constexpr std::uint64_t kNanosPerSecond = 1'000'000'000;
  std::string text = std::to_string(nanos / kNanosPerSecond);
  std::uint64_t fraction = nanos % kNanosPerSecond;
  if (fraction == 0) return text;
  std::string digits = std::to_string(fraction);
  digits.insert(0, 9 - digits.size(), '0');
  digits.erase(digits.find_last_not_of('0') + 1);
  return text + "." + digits;
}

std::string formatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  if (error != std::errc()) return "NaN";
  return std::string(buffer, end);
}

const char* tenantClassLabel(protocol::TenantClass tenantClass) {
  switch (tenantClass) {
    case protocol::TenantClass::BEST_EFFORT:
      return "best-effort";
    case protocol::TenantClass::LATENCY_CRITICAL:
      return "latency-critical";
  }
  return "unknown";  // a newer peer's enumerant
}

// Writes families one after another. A family's HELP/TYPE header goes out with its first sample,
// so families with no samples (no tenants, no limited tenant) leave no dangling header.
class ExpositionWriter {
public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    name_ = name;
    type_ = type;
    help_ = help;
    headerWritten_ = false;
  }

  void sample(std::initializer_list<Label> labels, std::string_view value) {
    if (!headerWritten_) {
      out_.append("# HELP ").append(name_).append(" ").append(escapeHelp(help_)).append("\n");
      out_.append("# TYPE ").append(name_).append(" ").append(type_).append("\n");
      headerWritten_ = true;
    }
    out_.append(name_);
    if (labels.size() != 0) {
      out_ += '{';
      bool first = true;
      for (const Label& label : labels) {
        if (!first) out_ += ',';
        first = false;
        out_.append(label.first).append("=\"").append(escapeLabelValue(label.second)) += '"';
      }
      out_ += '}';
    }
    out_.append(" ").append(value) += '\n';
  }

  std::string take() { return std::move(out_); }

private:
  std::string out_;
  std::string_view name_;
  std::string_view type_;
  std::string_view help_;
  bool headerWritten_ = false;
};

void writeDaemon(ExpositionWriter& out, protocol::DaemonStatus::Reader status) {
  out.family("gpuproxy_info", "gauge", "Always 1; labelled with the daemon's backend and version.");
  out.sample({{"backend", viewOf(status.getBackend())}, {"version", viewOf(status.getVersion())}},
             "1");
  out.family("gpuproxy_scheduler_info", "gauge",
             "Always 1; labelled with how kernels of different clients share a GPU.");
  if (status.getScheduler().size() != 0) {
    out.sample({{"scheduler", viewOf(status.getScheduler())}}, "1");
  }
  out.family("gpuproxy_uptime_seconds", "gauge", "Seconds since the daemon started.");
  out.sample({}, formatDouble(status.getUptimeSeconds()));
  out.family("gpuproxy_clients", "gauge", "Client processes attached now.");
  out.sample({}, formatUnsigned(status.getClients().size()));
}

void writeDevices(ExpositionWriter& out, capnp::List<protocol::DeviceStatus>::Reader devices) {
  // Indexes are formatted once: labels are views and must outlive every sample that uses them.
  std::vector<std::string> indexes;
  for (auto device : devices) indexes.push_back(formatUnsigned(device.getIndex()));

  out.family("gpuproxy_device_memory_used_bytes", "gauge",
             "Device memory allocated by clients, by the daemon's exact accounting.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}, {"name", viewOf(devices[i].getName())}},
               formatUnsigned(devices[i].getMemoryUsed()));
  }
  out.family("gpuproxy_device_memory_total_bytes", "gauge", "Total memory of the device.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}, {"name", viewOf(devices[i].getName())}},
               formatUnsigned(devices[i].getMemoryTotal()));
  }
  out.family("gpuproxy_device_clients", "gauge", "Clients with a context on the device.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, formatUnsigned(devices[i].getClients()));
  }
  out.family("gpuproxy_device_kernels_queued", "gauge",
             "Kernels the dispatcher holds for the scheduler, not yet submitted to the device.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, formatUnsigned(devices[i].getKernelsQueued()));
  }
  out.family("gpuproxy_device_kernels_in_flight", "gauge",
             "Kernels submitted to the device that have not completed.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, formatUnsigned(devices[i].getKernelsInFlight()));
  }
  out.family(
      "gpuproxy_device_blocking_calls_total", "counter",
      "Backend calls that may block for long (module preparation, allocation and free, "
      "pinned-memory registration, context reset) ended on the device's blocking-call thread.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, formatUnsigned(devices[i].getBlockingCalls()));
  }
  out.family("gpuproxy_device_blocking_call_seconds_total", "counter",
             "Time the ended blocking calls took, all together.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}},
               formatNanosAsSeconds(devices[i].getBlockingCallNanoseconds()));
  }
  out.family("gpuproxy_device_blocking_calls_pending", "gauge",
             "Blocking calls queued or running on the device's blocking-call thread.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, formatUnsigned(devices[i].getBlockingCallsPending()));
  }
  out.family("gpuproxy_device_poisoned", "gauge",
             "1 when a faulting kernel left the device's shared context with a sticky error.");
  for (unsigned i = 0; i < devices.size(); ++i) {
    out.sample({{"device", indexes[i]}}, devices[i].getStickyError() != 0 ? "1" : "0");
  }
}

void writeTenants(ExpositionWriter& out, capnp::List<protocol::TenantStatus>::Reader tenants) {
  out.family("gpuproxy_tenant_info", "gauge", "Always 1; labelled with the tenant's class.");
  for (auto tenant : tenants) {
    out.sample(
        {{"tenant", viewOf(tenant.getName())}, {"class", tenantClassLabel(tenant.getClass())}},
        "1");
  }
  out.family("gpuproxy_tenant_memory_used_bytes", "gauge",
             "Device memory the tenant's clients hold, summed over devices.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatUnsigned(tenant.getMemoryUsed()));
  }
  // The limit applies per device, so the per-device figure is the one to compare it with.
  out.family("gpuproxy_tenant_device_memory_used_bytes", "gauge",
             "Device memory the tenant's clients hold on one device.");
  for (auto tenant : tenants) {
    auto perDevice = tenant.getMemoryUsedPerDevice();
    for (unsigned d = 0; d < perDevice.size(); ++d) {
      std::string device = formatUnsigned(d);
      out.sample({{"tenant", viewOf(tenant.getName())}, {"device", device}},
                 formatUnsigned(perDevice[d]));
    }
  }
  out.family("gpuproxy_tenant_memory_limit_bytes", "gauge",
             "The tenant's memory limit per device; absent for a tenant without a limit.");
  for (auto tenant : tenants) {
    if (!tenant.getHasMemoryLimit()) continue;
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatUnsigned(tenant.getMemoryLimit()));
  }
  out.family("gpuproxy_tenant_pinned_memory_used_bytes", "gauge",
             "Pinned host memory (cuMemHostAlloc) the tenant's clients hold.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}},
               formatUnsigned(tenant.getPinnedMemoryUsed()));
  }
  out.family("gpuproxy_tenant_pinned_memory_limit_bytes", "gauge",
             "The tenant's pinned host memory limit; absent for a tenant without one.");
  for (auto tenant : tenants) {
    if (!tenant.getHasPinnedMemoryLimit()) continue;
    out.sample({{"tenant", viewOf(tenant.getName())}},
               formatUnsigned(tenant.getPinnedMemoryLimit()));
  }
  out.family("gpuproxy_tenant_clients", "gauge", "Client processes attached through the tenant.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatUnsigned(tenant.getClients()));
  }
  out.family("gpuproxy_tenant_weight", "gauge", "The tenant's best-effort scheduling weight.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatUnsigned(tenant.getWeight()));
  }
  out.family("gpuproxy_tenant_kernels_launched_total", "counter",
             "Kernels the tenant's clients have launched.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatUnsigned(tenant.getKernelsLaunched()));
  }
  out.family("gpuproxy_tenant_gpu_time_seconds_total", "counter",
             "Measured GPU time of the tenant's completed kernels.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatNanosAsSeconds(tenant.getGpuTimeNs()));
  }
  out.family(
      "gpuproxy_tenant_gpu_share_10s", "gauge",
      "The tenant's fraction (0..1) of the GPU time all tenants received over the last 10 s.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}}, formatDouble(tenant.getGpuShare10s()));
  }
  out.family("gpuproxy_tenant_allocation_failures_total", "counter",
             "Allocations refused; reason=\"limit\": they would have passed the tenant's limit.");
  for (auto tenant : tenants) {
    out.sample({{"tenant", viewOf(tenant.getName())}, {"reason", "limit"}},
               formatUnsigned(tenant.getOomCount()));
  }
}

}  // namespace

std::string escapeLabelValue(std::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string renderPrometheus(protocol::DaemonStatus::Reader status) {
  ExpositionWriter out;
  writeDaemon(out, status);
  writeDevices(out, status.getDevices());
  writeTenants(out, status.getTenants());
  return out.take();
}

}  // namespace gpuproxy::server
