// Initialisation, version and device queries. Devices are described once at attach; everything
// here answers locally without a round trip to the daemon.

#include <cuda.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::DeviceRecord;
using gpuproxy::stub::guarded;
using gpuproxy::stub::Runtime;

namespace {

CUresult deviceUuid(const char* entryPoint, CUuuid* uuid, CUdevice dev) noexcept {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    static_assert(sizeof(uuid->bytes) == std::tuple_size_v<decltype(device->uuid)>);
    std::memcpy(uuid->bytes, device->uuid.data(), sizeof(uuid->bytes));
    return CUDA_SUCCESS;
  });
}

// A device's PCI location as CUDA writes it: domain, bus and device in hexadecimal, function 0.
std::string pciBusIdOf(const DeviceRecord& device) {
  char text[32];
  std::snprintf(text, sizeof(text), "%04x:%02x:%02x.0",
                device.attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).value_or(0),
                device.attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).value_or(0),
                device.attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).value_or(0));
  return text;
}

// A PCI location in any of the forms cuDeviceGetByPCIBusId takes: domain:bus:device.function,
// domain:bus:device or bus:device.function, all in hexadecimal. nullopt for anything else.
struct PciLocation {
  unsigned domain = 0;
  unsigned bus = 0;
  unsigned device = 0;
};
std::optional<PciLocation> parsePciBusId(const char* text) {
  std::vector<unsigned> fields;
  std::vector<char> separators;
  const char* at = text;
  while (true) {
    char* end = nullptr;
    if (!std::isxdigit(static_cast<unsigned char>(*at))) return std::nullopt;
    const unsigned long value = std::strtoul(at, &end, 16);
    if (value > 0xffff) return std::nullopt;
    fields.push_back(static_cast<unsigned>(value));
    at = end;
    if (*at == '\0') break;
    if (*at != ':' && *at != '.') return std::nullopt;
    separators.push_back(*at++);
  }
  const std::string form(separators.begin(), separators.end());
  if (form == "::." || form == "::") return PciLocation{fields[0], fields[1], fields[2]};
  if (form == ":.") return PciLocation{0, fields[0], fields[1]};
  return std::nullopt;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  try {
    return Runtime::initialize();
  } catch (const std::exception& error) {
    GPUPROXY_STUB_LOG(kError, "cuInit: internal error: %s", error.what());
    return CUDA_ERROR_NO_DEVICE;
  } catch (...) {
    return CUDA_ERROR_NO_DEVICE;
  }
}

GPUPROXY_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Works before cuInit, as in CUDA: the version this stub was built against until the daemon
  // has said which driver it runs.
  Runtime* runtime = Runtime::instance();
  *driverVersion = runtime != nullptr ? runtime->driverVersion() : CUDA_VERSION;
  return CUDA_SUCCESS;
}

GPUPROXY_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetCount(int* count) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(runtime.devices().size());
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    const std::size_t copied = std::min(device->name.size(), static_cast<std::size_t>(len) - 1);
    std::memcpy(name, device->name.data(), copied);
    name[copied] = '\0';
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return deviceUuid(__func__, uuid, dev);
}

GPUPROXY_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return deviceUuid(__func__, uuid, dev);
}

GPUPROXY_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    const std::string text = pciBusIdOf(*device);
    const std::size_t copied = std::min(text.size(), static_cast<std::size_t>(len) - 1);
    std::memcpy(pciBusId, text.data(), copied);
    pciBusId[copied] = '\0';
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<PciLocation> wanted = parsePciBusId(pciBusId);
    if (!wanted) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t ordinal = 0; ordinal < runtime.devices().size(); ++ordinal) {
      const DeviceRecord* device = runtime.device(static_cast<CUdevice>(ordinal));
      if (device != nullptr &&
          device->attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).value_or(0) ==
              static_cast<int>(wanted->domain) &&
          device->attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).value_or(0) ==
              static_cast<int>(wanted->bus) &&
          device->attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).value_or(0) ==
              static_cast<int>(wanted->device)) {
        *dev = static_cast<CUdevice>(ordinal);
        return CUDA_SUCCESS;
      }
    }
    // Not one of the devices this process sees.
    return CUDA_ERROR_INVALID_DEVICE;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = static_cast<size_t>(device->totalMemory);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    std::optional<int> value = device->attribute(attrib);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    *pi = *value;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const DeviceRecord* device = runtime.device(dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    std::optional<int> majorValue = device->attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    std::optional<int> minorValue = device->attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    if (!majorValue || !minorValue) {
      GPUPROXY_STUB_LOG(kError, "cuDeviceComputeCapability: gpuproxyd did not report it");
      return CUDA_ERROR_UNKNOWN;
    }
    *major = *majorValue;
    *minor = *minorValue;
    return CUDA_SUCCESS;
  });
}
