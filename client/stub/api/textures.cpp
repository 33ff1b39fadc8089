// CUDA arrays, texture objects and surface objects.
//
// An array is an allocation of the tenant's like any other, in a dense layout the stub chooses
// (cuda_arrays.hpp); copies to and from it are copies of that memory. A texture or surface object
// is a header in the client's own device memory (protocol/texture_header.hpp) describing the
// resource and the sampler, and its handle is the header's device address: the sim backend's
// texture unit reads it there at each tex, tld4, suld or sust, as a GPU reads its texture headers.
// The cuda backend runs kernels on a GPU, whose texture instructions need objects the driver made
// in gpuproxyd's context; the daemon makes none, so there texture and surface objects are
// CUDA_ERROR_NOT_SUPPORTED (arrays, being memory, are served everywhere).
//
// Not served (CUDA_ERROR_NOT_SUPPORTED, with a log line): depth, sparse and mip-mapped arrays,
// formats other than 8/16/32-bit integers, half and float with 1, 2 or 4 channels, resource views,
// sRGB conversion.

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "client/stub/api/cuda_arrays.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "protocol/texture_header.hpp"

using gpuproxy::protocol::TextureHeader;
using gpuproxy::protocol::TextureHeaderKind;
using gpuproxy::protocol::TextureResource;
using gpuproxy::stub::ArrayLayout;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::Runtime;

namespace {

struct CudaArray {
  CUDA_ARRAY3D_DESCRIPTOR descriptor{};  // as created: Height and Depth 0 where it has none
  ArrayLayout layout;
};

// A texture or surface object: what it was made from, for the Get*Desc calls.
struct TextureObject {
  TextureHeaderKind kind = TextureHeaderKind::kTexture;
  CUDA_RESOURCE_DESC resource{};
  CUDA_TEXTURE_DESC texture{};
};

// Every array (by handle: the record's address) and object (by handle: its header's address).
struct Registry {
  std::mutex mutex;
  std::unordered_map<const CudaArray*, std::unique_ptr<CudaArray>> arrays;
  std::unordered_map<std::uint64_t, TextureObject> objects;

  static Registry& instance() {
    static auto* registry = new Registry();  // handles stay valid through static destruction
    return *registry;
  }
  // Callers hold mutex.
  CudaArray* findArray(CUarray handle) {
    auto found = arrays.find(reinterpret_cast<const CudaArray*>(handle));
    return found != arrays.end() ? found->second.get() : nullptr;
  }
};

// ---- arrays ----------------------------------------------------------------------------------

// A device attribute of the current context's device, when the device reports it.
std::optional<int> currentDeviceAttribute(Runtime& runtime, CUdevice_attribute attribute) {
  const std::optional<gpuproxy::stub::ContextRecord> context = runtime.context(currentContext());
  if (!context) return std::nullopt;
  const gpuproxy::stub::DeviceRecord* device =
      runtime.device(static_cast<CUdevice>(context->device));
  return device != nullptr ? device->attribute(attribute) : std::nullopt;
}

// Whether `value` is within the device's `attribute` (a maximum size); a maximum the device does
// not report limits nothing.
bool withinLimit(Runtime& runtime, CUdevice_attribute attribute, std::uint64_t value) {
  const std::optional<int> limit = currentDeviceAttribute(runtime, attribute);
  return !limit || *limit <= 0 || value <= static_cast<std::uint64_t>(*limit);
}

// The flags an array may have here: the others ask for layouts the texture unit does not model.
constexpr unsigned kServedArrayFlags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST |
                                       CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_TEXTURE_GATHER |
                                       CUDA_ARRAY3D_COLOR_ATTACHMENT;

CUresult checkArraySize(Runtime& runtime, const CUDA_ARRAY3D_DESCRIPTOR& descriptor) {
  const bool surface = (descriptor.Flags & CUDA_ARRAY3D_SURFACE_LDST) != 0;
  const std::uint64_t width = descriptor.Width;
  const std::uint64_t height = descriptor.Height;
  const std::uint64_t depth = descriptor.Depth;
  bool fits = true;
  if ((descriptor.Flags & CUDA_ARRAY3D_CUBEMAP) != 0) {
    const bool layered = (descriptor.Flags & CUDA_ARRAY3D_LAYERED) != 0;
    fits =
        layered
            ? withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH,
                          width) &&
                  withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS,
                              depth / 6) &&
                  (!surface ||
                   (withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH,
                                width) &&
                    withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS,
                                depth / 6)))
            : withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH, width) &&
                  (!surface ||
                   withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH, width));
  } else if ((descriptor.Flags & CUDA_ARRAY3D_LAYERED) != 0) {
    fits =
        height == 0
            ? withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH, width) &&
                  withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS, depth)
            : withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH, width) &&
                  withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT,
                              height) &&
                  withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS, depth);
  } else if (depth != 0) {
    fits =
        withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH, width) &&
        withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT, height) &&
        withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH, depth) &&
        (!surface || (withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH, width) &&
                      withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT, height) &&
                      withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH, depth)));
  } else if (height != 0) {
    fits =
        withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, width) &&
        withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT, height) &&
        (!surface || (withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH, width) &&
                      withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT, height)));
  } else {
    fits = withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, width) &&
           (!surface || withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH, width));
  }
  return fits ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult createArray(const char* entryPoint, CUarray* handle,
                     const CUDA_ARRAY3D_DESCRIPTOR& descriptor) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if ((descriptor.Flags & ~kServedArrayFlags) != 0) {
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: depth, sparse and deferred-mapping arrays are not supported (flags "
                        "0x%x)",
                        entryPoint, descriptor.Flags);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // A layered array has its layers as Depth (a 1D one no Height); others have no Depth without
    // a Height.
    const bool layered = (descriptor.Flags & CUDA_ARRAY3D_LAYERED) != 0;
    if (descriptor.Width == 0 || (layered && descriptor.Depth == 0) ||
        (!layered && descriptor.Height == 0 && descriptor.Depth != 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // A cube map's faces are square, six per cube: Depth 6, or (layered) a multiple of 6.
    if ((descriptor.Flags & CUDA_ARRAY3D_CUBEMAP) != 0 &&
        (descriptor.Width != descriptor.Height ||
         (layered ? descriptor.Depth % 6 != 0 : descriptor.Depth != 6))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const unsigned channels = descriptor.NumChannels;
    if (channels != 1 && channels != 2 && channels != 4) return CUDA_ERROR_INVALID_VALUE;
    const std::uint32_t elementBytes =
        gpuproxy::protocol::elementBytes(gpuproxy::stub::enumValue(descriptor.Format), channels);
    if (elementBytes == 0) {
      GPUPROXY_STUB_LOG(kWarn, "%s: array format 0x%x is not supported", entryPoint,
                        gpuproxy::stub::enumValue(descriptor.Format));
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // Gather reads the four texels of a 2D footprint.
    if ((descriptor.Flags & CUDA_ARRAY3D_TEXTURE_GATHER) != 0 &&
        (layered || descriptor.Height == 0 || descriptor.Depth != 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult fits = checkArraySize(runtime, descriptor); fits != CUDA_SUCCESS) return fits;
    ArrayLayout layout;
    layout.height = descriptor.Height == 0 ? 1 : descriptor.Height;
    const std::uint64_t depth = descriptor.Depth == 0 ? 1 : descriptor.Depth;
    if (__builtin_mul_overflow(std::uint64_t{descriptor.Width}, elementBytes, &layout.pitch) ||
        __builtin_mul_overflow(layout.height, depth, &layout.rows) ||
        __builtin_mul_overflow(layout.pitch, layout.rows, &layout.bytes)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult allocated = cuMemAlloc_v2(&layout.base, static_cast<std::size_t>(layout.bytes));
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    auto array = std::make_unique<CudaArray>();
    array->descriptor = descriptor;
    array->layout = layout;
    Registry& registry = Registry::instance();
    std::lock_guard lock(registry.mutex);
    *handle = reinterpret_cast<CUarray>(array.get());
    registry.arrays.emplace(array.get(), std::move(array));
    return CUDA_SUCCESS;
  });
}

// Runs copy(address) on the device memory of [offset, offset + bytes) of an array (the legacy
// cuMemcpy*A* calls address an array as the bytes of its elements in order).
template <typename Copy>
CUresult withArrayBytes(CUarray array, std::size_t offset, std::size_t bytes, Copy&& copy) {
  const std::optional<ArrayLayout> layout = gpuproxy::stub::arrayLayout(array);
  if (!layout) return CUDA_ERROR_INVALID_HANDLE;
  std::uint64_t end = 0;
  if (__builtin_add_overflow(std::uint64_t{offset}, std::uint64_t{bytes}, &end) ||
      end > layout->bytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return copy(layout->base + offset);
}

}  // namespace

namespace gpuproxy::stub {

std::optional<ArrayLayout> arrayLayout(CUarray array) {
  Registry& registry = Registry::instance();
  std::lock_guard lock(registry.mutex);
  const CudaArray* found = registry.findArray(array);
  if (found == nullptr) return std::nullopt;
  return found->layout;
}

}  // namespace gpuproxy::stub

GPUPROXY_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle,
                                          const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR descriptor{};
  descriptor.Width = pAllocateArray->Width;
  descriptor.Height = pAllocateArray->Height;
  descriptor.Format = pAllocateArray->Format;
  descriptor.NumChannels = pAllocateArray->NumChannels;
  return createArray(__func__, pHandle, descriptor);
}

GPUPROXY_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return createArray(__func__, pHandle, *pAllocateArray);
}

GPUPROXY_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
  return guarded(__func__, [&](Runtime&) {
    std::unique_ptr<CudaArray> array;
    {
      Registry& registry = Registry::instance();
      std::lock_guard lock(registry.mutex);
      auto found = registry.arrays.find(reinterpret_cast<const CudaArray*>(hArray));
      if (found == registry.arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
      array = std::move(found->second);
      registry.arrays.erase(found);
    }
    // Like cuMemFree, after the work queued before that may still read it.
    return cuMemFree_v2(array->layout.base);
  });
}

GPUPROXY_EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* pArrayDescriptor,
                                                   CUarray hArray) {
  return guarded(__func__, [&](Runtime&) {
    if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Registry& registry = Registry::instance();
    std::lock_guard lock(registry.mutex);
    const CudaArray* array = registry.findArray(hArray);
    if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *pArrayDescriptor = array->descriptor;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* pArrayDescriptor,
                                                 CUarray hArray) {
  CUDA_ARRAY3D_DESCRIPTOR descriptor{};
  if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult found = cuArray3DGetDescriptor_v2(&descriptor, hArray); found != CUDA_SUCCESS) {
    return found;
  }
  pArrayDescriptor->Width = descriptor.Width;
  pArrayDescriptor->Height = descriptor.Height;
  pArrayDescriptor->Format = descriptor.Format;
  pArrayDescriptor->NumChannels = descriptor.NumChannels;
  return CUDA_SUCCESS;
}

// ---- copies that name an array by byte offset ---------------------------------------------------

// Each is the linear copy it names, of the array's bytes.
GPUPROXY_EXPORT CUresult cuMemcpyHtoA_v2(CUarray dstArray, size_t dstOffset, const void* srcHost,
                                         size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyHtoD_v2(destination, srcHost, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                                              const void* srcHost, size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyHtoD_v2_ptds(destination, srcHost, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoH_v2(void* dstHost, CUarray srcArray, size_t srcOffset,
                                         size_t ByteCount) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoH_v2(dstHost, source, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoH_v2_ptds(void* dstHost, CUarray srcArray, size_t srcOffset,
                                              size_t ByteCount) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoH_v2_ptds(dstHost, source, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoAAsync_v2(CUarray dstArray, size_t dstOffset,
                                              const void* srcHost, size_t ByteCount,
                                              CUstream hStream) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyHtoDAsync_v2(destination, srcHost, ByteCount, hStream);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoAAsync_v2_ptsz(CUarray dstArray, size_t dstOffset,
                                                   const void* srcHost, size_t ByteCount,
                                                   CUstream hStream) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyHtoDAsync_v2_ptsz(destination, srcHost, ByteCount, hStream);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoHAsync_v2(void* dstHost, CUarray srcArray, size_t srcOffset,
                                              size_t ByteCount, CUstream hStream) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoHAsync_v2(dstHost, source, ByteCount, hStream);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoHAsync_v2_ptsz(void* dstHost, CUarray srcArray,
                                                   size_t srcOffset, size_t ByteCount,
                                                   CUstream hStream) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoHAsync_v2_ptsz(dstHost, source, ByteCount, hStream);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset,
                                         size_t ByteCount) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoD_v2(dstDevice, source, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoD_v2_ptds(CUdeviceptr dstDevice, CUarray srcArray,
                                              size_t srcOffset, size_t ByteCount) {
  return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
    return cuMemcpyDtoD_v2_ptds(dstDevice, source, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoA_v2(CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice,
                                         size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyDtoD_v2(destination, srcDevice, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                                              CUdeviceptr srcDevice, size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return cuMemcpyDtoD_v2_ptds(destination, srcDevice, ByteCount);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoA_v2(CUarray dstArray, size_t dstOffset, CUarray srcArray,
                                         size_t srcOffset, size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
      return cuMemcpyDtoD_v2(destination, source, ByteCount);
    });
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyAtoA_v2_ptds(CUarray dstArray, size_t dstOffset, CUarray srcArray,
                                              size_t srcOffset, size_t ByteCount) {
  return withArrayBytes(dstArray, dstOffset, ByteCount, [&](CUdeviceptr destination) {
    return withArrayBytes(srcArray, srcOffset, ByteCount, [&](CUdeviceptr source) {
      return cuMemcpyDtoD_v2_ptds(destination, source, ByteCount);
    });
  });
}

// ---- texture and surface objects ------------------------------------------------------------

namespace {

// Whether the daemon's kernels read gpuproxy's texture headers: the sim's interpreter does; a GPU
// (the cuda backend) needs objects its driver made.
bool texturesServed(Runtime& runtime, const char* entryPoint) {
  if (runtime.backend() == "sim") return true;
  static std::once_flag logged;
  std::call_once(logged, [&] {
    GPUPROXY_STUB_LOG(kWarn, "%s: texture and surface objects are not supported on the %s backend",
                      entryPoint, runtime.backend().c_str());
  });
  return false;
}

bool isIntegerFormat(std::uint32_t format) {
  return format != CU_AD_FORMAT_HALF && format != CU_AD_FORMAT_FLOAT;
}

// The resource part of a header, from `resource`.
CUresult describeResource(Runtime& runtime, const char* entryPoint,
                          const CUDA_RESOURCE_DESC& resource, TextureHeaderKind kind,
                          TextureHeader& header) {
  if (resource.flags != 0) return CUDA_ERROR_INVALID_VALUE;
  header.kind = kind;
  switch (gpuproxy::stub::enumValue(resource.resType)) {
    case CU_RESOURCE_TYPE_ARRAY: {
      Registry& registry = Registry::instance();
      std::lock_guard lock(registry.mutex);
      const CudaArray* array = registry.findArray(resource.res.array.hArray);
      if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      const CUDA_ARRAY3D_DESCRIPTOR& descriptor = array->descriptor;
      if (kind == TextureHeaderKind::kSurface &&
          (descriptor.Flags & CUDA_ARRAY3D_SURFACE_LDST) == 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      header.resource = TextureResource::kArray;
      header.base = array->layout.base;
      header.pitch = array->layout.pitch;
      header.slicePitch = array->layout.pitch * array->layout.height;
      header.width = static_cast<std::uint32_t>(descriptor.Width);
      header.height = static_cast<std::uint32_t>(array->layout.height);
      header.depth = static_cast<std::uint32_t>(descriptor.Depth == 0 ? 1 : descriptor.Depth);
      // A cube map is a layered 2D array of its faces.
      header.cubemap = (descriptor.Flags & CUDA_ARRAY3D_CUBEMAP) != 0 ? 1 : 0;
      header.layered =
          (descriptor.Flags & CUDA_ARRAY3D_LAYERED) != 0 || header.cubemap != 0 ? 1 : 0;
      header.dimensions = header.layered != 0      ? (descriptor.Height != 0 ? 2 : 1)
                          : descriptor.Depth != 0  ? 3
                          : descriptor.Height != 0 ? 2
                                                   : 1;
      header.format = gpuproxy::stub::enumValue(descriptor.Format);
      header.channels = descriptor.NumChannels;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_LINEAR: {
      if (kind == TextureHeaderKind::kSurface) return CUDA_ERROR_INVALID_VALUE;
      const auto& linear = resource.res.linear;
      header.format = gpuproxy::stub::enumValue(linear.format);
      header.channels = linear.numChannels;
      const std::uint32_t elementBytes =
          gpuproxy::protocol::elementBytes(header.format, header.channels);
      if (elementBytes == 0) break;
      const std::uint64_t width = linear.sizeInBytes / elementBytes;
      if (linear.devPtr == 0 || width == 0 || width > 0xffffffffu ||
          !withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH, width) ||
          !runtime.ownsRange(linear.devPtr, linear.sizeInBytes)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      header.resource = TextureResource::kLinear;
      header.base = linear.devPtr;
      header.width = static_cast<std::uint32_t>(width);
      header.pitch = linear.sizeInBytes;
      header.slicePitch = linear.sizeInBytes;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_PITCH2D: {
      if (kind == TextureHeaderKind::kSurface) return CUDA_ERROR_INVALID_VALUE;
      const auto& pitched = resource.res.pitch2D;
      header.format = gpuproxy::stub::enumValue(pitched.format);
      header.channels = pitched.numChannels;
      const std::uint32_t elementBytes =
          gpuproxy::protocol::elementBytes(header.format, header.channels);
      if (elementBytes == 0) break;
      const std::uint64_t pitchAlignment = static_cast<std::uint64_t>(std::max(
          currentDeviceAttribute(runtime, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT).value_or(1),
          1));
      std::uint64_t rowBytes = 0;
      std::uint64_t extent = 0;
      if (pitched.devPtr == 0 || pitched.width == 0 || pitched.height == 0 ||
          pitched.width > 0xffffffffu || pitched.height > 0xffffffffu ||
          pitched.pitchInBytes % pitchAlignment != 0 ||
          __builtin_mul_overflow(std::uint64_t{pitched.width}, elementBytes, &rowBytes) ||
          rowBytes > pitched.pitchInBytes ||
          !withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH,
                       pitched.width) ||
          !withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT,
                       pitched.height) ||
          !withinLimit(runtime, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH,
                       pitched.pitchInBytes) ||
          __builtin_mul_overflow(std::uint64_t{pitched.height} - 1,
                                 std::uint64_t{pitched.pitchInBytes}, &extent) ||
          __builtin_add_overflow(extent, rowBytes, &extent) ||
          !runtime.ownsRange(pitched.devPtr, extent)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      header.resource = TextureResource::kPitch2D;
      header.base = pitched.devPtr;
      header.pitch = pitched.pitchInBytes;
      header.slicePitch = extent;
      header.width = static_cast<std::uint32_t>(pitched.width);
      header.height = static_cast<std::uint32_t>(pitched.height);
      header.dimensions = 2;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      GPUPROXY_STUB_LOG(kWarn, "%s: mip-mapped arrays are not supported", entryPoint);
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  GPUPROXY_STUB_LOG(kWarn, "%s: format 0x%x with %u channels is not supported", entryPoint,
                    header.format, header.channels);
  return header.channels == 1 || header.channels == 2 || header.channels == 4
             ? CUDA_ERROR_NOT_SUPPORTED
             : CUDA_ERROR_INVALID_VALUE;
}

// The sampler part of a texture's header, from `texture`.
CUresult describeSampler(const char* entryPoint, const CUDA_TEXTURE_DESC& texture,
                         TextureHeader& header) {
  for (int dimension = 0; dimension < 3; ++dimension) {
    const int mode = gpuproxy::stub::enumValue(texture.addressMode[dimension]);
    if (mode < CU_TR_ADDRESS_MODE_WRAP || mode > CU_TR_ADDRESS_MODE_BORDER) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    header.addressMode[dimension] = static_cast<std::uint32_t>(mode);
  }
  const int filter = gpuproxy::stub::enumValue(texture.filterMode);
  if (filter != CU_TR_FILTER_MODE_POINT && filter != CU_TR_FILTER_MODE_LINEAR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  header.filterMode = static_cast<std::uint32_t>(filter);
  if ((texture.flags & CU_TRSF_SRGB) != 0) {
    GPUPROXY_STUB_LOG(kWarn, "%s: sRGB conversion is not supported", entryPoint);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  header.flags = texture.flags;
  // Filtering interpolates, which only values read as floats can be: 32-bit integers always read
  // as integers, narrower ones unless normalised to [0, 1] or [-1, 1].
  const bool readsIntegers =
      isIntegerFormat(header.format) && ((texture.flags & CU_TRSF_READ_AS_INTEGER) != 0 ||
                                         gpuproxy::protocol::channelBytes(header.format) == 4);
  if (filter == CU_TR_FILTER_MODE_LINEAR && readsIntegers) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(header.borderColor, texture.borderColor, sizeof(header.borderColor));
  return CUDA_SUCCESS;
}

// Places `header` in the current context's memory; its address is the object's handle.
CUresult placeHeader(const TextureHeader& header, std::uint64_t& handle) {
  CUdeviceptr address = 0;
  if (CUresult allocated = cuMemAlloc_v2(&address, sizeof(header)); allocated != CUDA_SUCCESS) {
    return allocated;
  }
  if (CUresult written = cuMemcpyHtoD_v2(address, &header, sizeof(header));
      written != CUDA_SUCCESS) {
    cuMemFree_v2(address);
    return written;
  }
  handle = address;
  return CUDA_SUCCESS;
}

CUresult createObject(const char* entryPoint, std::uint64_t* handle,
                      const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
                      const CUDA_RESOURCE_VIEW_DESC* view, TextureHeaderKind kind) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (handle == nullptr || resource == nullptr ||
        (kind == TextureHeaderKind::kTexture && texture == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!texturesServed(runtime, entryPoint)) return CUDA_ERROR_NOT_SUPPORTED;
    // A view without a format reinterprets nothing (cudart passes such for "no view").
    if (view != nullptr && gpuproxy::stub::enumValue(view->format) != CU_RES_VIEW_FORMAT_NONE) {
      GPUPROXY_STUB_LOG(kWarn, "%s: resource views are not supported", entryPoint);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    TextureHeader header;
    if (CUresult described = describeResource(runtime, entryPoint, *resource, kind, header);
        described != CUDA_SUCCESS) {
      return described;
    }
    if (kind == TextureHeaderKind::kTexture) {
      if (CUresult described = describeSampler(entryPoint, *texture, header);
          described != CUDA_SUCCESS) {
        return described;
      }
    }
    std::uint64_t placed = 0;
    if (CUresult result = placeHeader(header, placed); result != CUDA_SUCCESS) return result;
    TextureObject object;
    object.kind = kind;
    object.resource = *resource;
    if (texture != nullptr) object.texture = *texture;
    Registry& registry = Registry::instance();
    std::lock_guard lock(registry.mutex);
    registry.objects[placed] = object;
    *handle = placed;
    return CUDA_SUCCESS;
  });
}

CUresult destroyObject(const char* entryPoint, std::uint64_t handle, TextureHeaderKind kind) {
  return guarded(entryPoint, [&](Runtime&) {
    {
      Registry& registry = Registry::instance();
      std::lock_guard lock(registry.mutex);
      auto found = registry.objects.find(handle);
      if (found == registry.objects.end() || found->second.kind != kind) {
        return CUDA_ERROR_INVALID_HANDLE;
      }
      registry.objects.erase(found);
    }
    return cuMemFree_v2(handle);
  });
}

// What object `handle` (of `kind`) was made from.
CUresult findObject(const char* entryPoint, std::uint64_t handle, TextureHeaderKind kind,
                    TextureObject& object) {
  return guarded(entryPoint, [&](Runtime&) {
    Registry& registry = Registry::instance();
    std::lock_guard lock(registry.mutex);
    auto found = registry.objects.find(handle);
    if (found == registry.objects.end() || found->second.kind != kind) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    object = found->second;
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuTexObjectCreate(CUtexObject* pTexObject,
                                           const CUDA_RESOURCE_DESC* pResDesc,
                                           const CUDA_TEXTURE_DESC* pTexDesc,
                                           const CUDA_RESOURCE_VIEW_DESC* pResViewDesc) {
  static_assert(sizeof(CUtexObject) == sizeof(std::uint64_t));
  return createObject(__func__, reinterpret_cast<std::uint64_t*>(pTexObject), pResDesc, pTexDesc,
                      pResViewDesc, TextureHeaderKind::kTexture);
}

GPUPROXY_EXPORT CUresult cuTexObjectDestroy(CUtexObject texObject) {
  return destroyObject(__func__, texObject, TextureHeaderKind::kTexture);
}

GPUPROXY_EXPORT CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc,
                                                    CUtexObject texObject) {
  if (pResDesc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TextureObject object;
  const CUresult found = findObject(__func__, texObject, TextureHeaderKind::kTexture, object);
  if (found == CUDA_SUCCESS) *pResDesc = object.resource;
  return found;
}

GPUPROXY_EXPORT CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* pTexDesc,
                                                   CUtexObject texObject) {
  if (pTexDesc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TextureObject object;
  const CUresult found = findObject(__func__, texObject, TextureHeaderKind::kTexture, object);
  if (found == CUDA_SUCCESS) *pTexDesc = object.texture;
  return found;
}

// No object here has a view; CUDA answers an object made without one this way.
GPUPROXY_EXPORT CUresult cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* pResViewDesc,
                                                        CUtexObject texObject) {
  if (pResViewDesc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TextureObject object;
  const CUresult found = findObject(__func__, texObject, TextureHeaderKind::kTexture, object);
  return found == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : found;
}

GPUPROXY_EXPORT CUresult cuSurfObjectCreate(CUsurfObject* pSurfObject,
                                            const CUDA_RESOURCE_DESC* pResDesc) {
  static_assert(sizeof(CUsurfObject) == sizeof(std::uint64_t));
  if (pResDesc != nullptr &&
      gpuproxy::stub::enumValue(pResDesc->resType) != CU_RESOURCE_TYPE_ARRAY) {
    return CUDA_ERROR_INVALID_VALUE;  // surfaces are made of arrays only
  }
  return createObject(__func__, reinterpret_cast<std::uint64_t*>(pSurfObject), pResDesc, nullptr,
                      nullptr, TextureHeaderKind::kSurface);
}

GPUPROXY_EXPORT CUresult cuSurfObjectDestroy(CUsurfObject surfObject) {
  return destroyObject(__func__, surfObject, TextureHeaderKind::kSurface);
}

GPUPROXY_EXPORT CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc,
                                                     CUsurfObject surfObject) {
  if (pResDesc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TextureObject object;
  const CUresult found = findObject(__func__, surfObject, TextureHeaderKind::kSurface, object);
  if (found == CUDA_SUCCESS) *pResDesc = object.resource;
  return found;
}
