// Initialisation, version and device queries. Devices are described once at attach; everything
// here answers locally without a round trip to the daemon.

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>

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
