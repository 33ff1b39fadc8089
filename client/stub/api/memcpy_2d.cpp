// 2D and 3D copies (cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy2DAsync, cuMemcpy3D(Async)) between
// host memory, device memory and CUDA arrays, made of the copies the stub already has: one per
// row, or a single one when both sides are contiguous (each pitch equals the width). An array is
// device memory in a dense layout (cuda_arrays.hpp): a side naming one is that memory, with the
// array's row as its pitch and its rows as the bounds.
//
// The blocking variants queue the rows like the Async one and then wait for the stream, so a
// copy of many rows costs one wait, not one per row. Another device's memory than the stream's is
// copied on that device (beginOnOwnDevice, api_support.hpp).

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "client/stub/api/cuda_arrays.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;

namespace ring = gpuproxy::protocol::ring;

namespace {

// One side of the copy, resolved: where its first row starts and whether that is device memory.
struct Side {
  bool device = false;
  std::uint64_t address = 0;  // of the first byte copied
  std::uint64_t pitch = 0;
};

// The side's memory type as the copy uses it, or the driver's error for it. An array side must
// hold the copied rectangle (`width` bytes by `height` rows from xInBytes, y: a 3D copy's slices
// are rows further down, as the array's layout has them).
CUresult resolveSide(Runtime& runtime, int type, const void* host, CUdeviceptr device,
                     CUarray array, std::size_t pitch, std::size_t xInBytes, std::size_t y,
                     std::uint64_t width, std::uint64_t height, Side& side) {
  std::uint64_t base = 0;
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      side.device = false;
      base = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(host));
      break;
    case CU_MEMORYTYPE_DEVICE:
      side.device = true;
      base = device;
      break;
    // Unified addressing: an address inside one of this process's allocations is device memory.
    case CU_MEMORYTYPE_UNIFIED:
      side.device = runtime.ownsRange(device, 1);
      base = device;
      break;
    case CU_MEMORYTYPE_ARRAY: {
      const std::optional<gpuproxy::stub::ArrayLayout> layout = gpuproxy::stub::arrayLayout(array);
      if (!layout) return CUDA_ERROR_INVALID_HANDLE;
      std::uint64_t rowEnd = 0;
      std::uint64_t rowsEnd = 0;
      if (__builtin_add_overflow(std::uint64_t{xInBytes}, width, &rowEnd) ||
          rowEnd > layout->pitch || __builtin_add_overflow(std::uint64_t{y}, height, &rowsEnd) ||
          rowsEnd > layout->rows) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      side.device = true;
      base = layout->base;
      pitch = static_cast<std::size_t>(layout->pitch);
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (base == 0) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t offset = 0;
  if (__builtin_mul_overflow(std::uint64_t{y}, std::uint64_t{pitch}, &offset) ||
      __builtin_add_overflow(offset, std::uint64_t{xInBytes}, &offset) ||
      __builtin_add_overflow(base, offset, &side.address)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  side.pitch = pitch;
  return CUDA_SUCCESS;
}

// The bytes a side spans from its first copied byte: (height - 1) pitches and a row.
std::optional<std::uint64_t> extentOf(const Side& side, std::uint64_t width, std::uint64_t height) {
  std::uint64_t extent = 0;
  if (__builtin_mul_overflow(height - 1, side.pitch, &extent) ||
      __builtin_add_overflow(extent, width, &extent) ||
      __builtin_add_overflow(side.address, extent, &extent)) {
    return std::nullopt;
  }
  return extent - side.address;
}

// A device-to-host copy of rows whose span is at most this is one copy of the span.
constexpr std::uint64_t kGatheredSpanBytes = 64ull << 20;

// One contiguous piece, through the copy path its two sides call for.
CUresult copyPiece(Runtime& runtime, const StreamTarget& target, const Side& dst, const Side& src,
                   std::uint64_t dstAddress, std::uint64_t srcAddress, std::uint64_t bytes) {
  if (dst.device && src.device) {
    return gpuproxy::stub::enqueueDeviceToDevice(runtime, target, dstAddress, srcAddress, bytes);
  }
  if (dst.device) {
    return runtime.commands().copyHostToDevice(
        target, dstAddress, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(srcAddress)),
        static_cast<std::size_t>(bytes), /*blocking=*/false);
  }
  if (src.device) {
    return runtime.commands().copyDeviceToHost(
        target, reinterpret_cast<void*>(static_cast<std::uintptr_t>(dstAddress)), srcAddress,
        static_cast<std::size_t>(bytes), /*blocking=*/false);
  }
  std::memmove(reinterpret_cast<void*>(static_cast<std::uintptr_t>(dstAddress)),
               reinterpret_cast<const void*>(static_cast<std::uintptr_t>(srcAddress)),
               static_cast<std::size_t>(bytes));
  return CUDA_SUCCESS;
}

CUresult memcpy2D(const char* entryPoint, const CUDA_MEMCPY2D* copy, CUstream stream,
                  NullStream nullStream, bool blocking) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    const std::uint64_t width = copy->WidthInBytes;
    const std::uint64_t height = copy->Height;
    // Each row must fit in its pitch (a pitch of 0, "not specified", only for a single row),
    // and no pitch may exceed the device's maximum.
    auto pitchFits = [&](std::size_t pitch, std::size_t xInBytes) {
      if (pitch == 0) return height <= 1;
      std::uint64_t rowEnd = 0;
      return !__builtin_add_overflow(std::uint64_t{xInBytes}, width, &rowEnd) && rowEnd <= pitch;
    };
    const bool srcHasPitch = copy->srcMemoryType != CU_MEMORYTYPE_ARRAY;
    const bool dstHasPitch = copy->dstMemoryType != CU_MEMORYTYPE_ARRAY;
    if ((srcHasPitch && !pitchFits(copy->srcPitch, copy->srcXInBytes)) ||
        (dstHasPitch && !pitchFits(copy->dstPitch, copy->dstXInBytes))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (auto context = runtime.context(target.context)) {
      const auto* device = runtime.device(static_cast<CUdevice>(context->device));
      const std::optional<int> maxPitch =
          device != nullptr ? device->attribute(CU_DEVICE_ATTRIBUTE_MAX_PITCH) : std::nullopt;
      if (maxPitch && *maxPitch > 0 &&
          ((srcHasPitch && copy->srcPitch > static_cast<std::size_t>(*maxPitch)) ||
           (dstHasPitch && copy->dstPitch > static_cast<std::size_t>(*maxPitch)))) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    Side src;
    Side dst;
    if (CUresult resolved = resolveSide(
            runtime, gpuproxy::stub::enumValue(copy->srcMemoryType), copy->srcHost, copy->srcDevice,
            copy->srcArray, copy->srcPitch, copy->srcXInBytes, copy->srcY, width, height, src);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (CUresult resolved = resolveSide(
            runtime, gpuproxy::stub::enumValue(copy->dstMemoryType), copy->dstHost, copy->dstDevice,
            copy->dstArray, copy->dstPitch, copy->dstXInBytes, copy->dstY, width, height, dst);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    const std::optional<std::uint64_t> srcExtent = extentOf(src, width, height);
    const std::optional<std::uint64_t> dstExtent = extentOf(dst, width, height);
    if (!srcExtent || !dstExtent) return CUDA_ERROR_INVALID_VALUE;
    // Device sides must lie in this process's memory, as for every copy.
    if ((src.device && !runtime.ownsRange(src.address, *srcExtent)) ||
        (dst.device && !runtime.ownsRange(dst.address, *dstExtent))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // A copy between host buffers waits for the stream's earlier work, as the driver orders it.
    if (!src.device && !dst.device) {
      if (CUresult drained = runtime.commands().synchronize(
              target.context, ring::SynchronizeKind::kStream, target.stream, /*query=*/false);
          drained != CUDA_SUCCESS) {
        return drained;
      }
    }
    // Memory of another device than the stream's runs there (beginOnOwnDevice); a copy between
    // two devices' memory is the daemon's to refuse.
    std::optional<StreamTarget> elsewhere;
    if (src.device || dst.device) {
      if (CUresult begun = gpuproxy::stub::beginOnOwnDevice(
              runtime, target, dst.device ? dst.address : src.address, elsewhere);
          begun != CUDA_SUCCESS) {
        return begun;
      }
    }
    const StreamTarget& queueOn = elsewhere ? *elsewhere : target;
    const bool contiguous = height == 1 || (src.pitch == width && dst.pitch == width);
    if (!contiguous && src.device && !dst.device && *srcExtent <= kGatheredSpanBytes) {
      // Device to host memory the stub writes itself waits for each piece, so row by row would be
      // a round trip per row (a column of a matrix: one per element). The rows' whole span comes
      // over in one copy instead, and the rows are taken out of it here.
      std::unique_ptr<std::byte[]> span(new std::byte[*srcExtent]);
      if (CUresult copied = runtime.commands().copyDeviceToHost(
              queueOn, span.get(), src.address, static_cast<std::size_t>(*srcExtent),
              /*blocking=*/true);
          copied != CUDA_SUCCESS) {
        return copied;
      }
      for (std::uint64_t row = 0; row < height; ++row) {
        std::memcpy(
            reinterpret_cast<void*>(static_cast<std::uintptr_t>(dst.address + row * dst.pitch)),
            span.get() + row * src.pitch, static_cast<std::size_t>(width));
      }
    } else if (contiguous) {
      if (CUresult copied =
              copyPiece(runtime, queueOn, dst, src, dst.address, src.address, width * height);
          copied != CUDA_SUCCESS) {
        return copied;
      }
    } else {
      for (std::uint64_t row = 0; row < height; ++row) {
        if (CUresult copied = copyPiece(runtime, queueOn, dst, src, dst.address + row * dst.pitch,
                                        src.address + row * src.pitch, width);
            copied != CUDA_SUCCESS) {
          return copied;
        }
      }
    }
    if (elsewhere) return gpuproxy::stub::finishOnOwnDevice(runtime, *elsewhere);
    if (!blocking || (!src.device && !dst.device)) return CUDA_SUCCESS;
    return runtime.commands().synchronize(target.context, ring::SynchronizeKind::kStream,
                                          target.stream, /*query=*/false);
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, NullStream::kPerThread, true);
}

// The stub's copies have no alignment requirement, so Unaligned is the same copy.
GPUPROXY_EXPORT CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, NullStream::kPerThread, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return memcpy2D(__func__, pCopy, hStream, NullStream::kLegacy, false);
}

GPUPROXY_EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return memcpy2D(__func__, pCopy, hStream, NullStream::kPerThread, false);
}

// ---- 3D copies ----------------------------------------------------------------------------------

namespace {

// A 3D copy is Depth 2D copies, one per slice: slice z of a side starts srcHeight (dstHeight) rows
// after slice z - 1, so as a 2D copy it is the same plane with its rows moved down. The slices go
// into the stream in order; a blocking copy waits once, after the last.
CUresult memcpy3D(const char* entryPoint, const CUDA_MEMCPY3D* copy, CUstream stream,
                  NullStream nullStream, bool blocking) {
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (copy->srcLOD != 0 || copy->dstLOD != 0 || copy->reserved0 != nullptr ||
      copy->reserved1 != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t depth = copy->Depth;
  // An array's slices are as high as the array; a pitched side says how high its are.
  auto sliceHeightOf = [](CUmemorytype type, CUarray array, std::size_t height) -> std::size_t {
    if (gpuproxy::stub::enumValue(type) != CU_MEMORYTYPE_ARRAY) return height;
    const std::optional<gpuproxy::stub::ArrayLayout> layout = gpuproxy::stub::arrayLayout(array);
    return layout ? static_cast<std::size_t>(layout->height) : height;
  };
  const std::size_t srcHeight = sliceHeightOf(copy->srcMemoryType, copy->srcArray, copy->srcHeight);
  const std::size_t dstHeight = sliceHeightOf(copy->dstMemoryType, copy->dstArray, copy->dstHeight);
  // Slices below the first need their side's slice height, and a slice must hold the rows.
  auto slicesFit = [&](std::size_t sliceHeight, std::size_t y, std::size_t z) {
    if (depth <= 1 && z == 0) return true;
    std::uint64_t rows = 0;
    return !__builtin_add_overflow(std::uint64_t{y}, std::uint64_t{copy->Height}, &rows) &&
           rows <= sliceHeight;
  };
  if (!slicesFit(srcHeight, copy->srcY, copy->srcZ) ||
      !slicesFit(dstHeight, copy->dstY, copy->dstZ)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // No slice at all still checks the stream and the sides, as one empty plane.
  const std::uint64_t slices = depth == 0 ? 1 : depth;
  for (std::uint64_t z = 0; z < slices; ++z) {
    CUDA_MEMCPY2D slice{};
    slice.srcXInBytes = copy->srcXInBytes;
    slice.srcMemoryType = copy->srcMemoryType;
    slice.srcHost = copy->srcHost;
    slice.srcDevice = copy->srcDevice;
    slice.srcArray = copy->srcArray;
    slice.srcPitch = copy->srcPitch;
    slice.dstXInBytes = copy->dstXInBytes;
    slice.dstMemoryType = copy->dstMemoryType;
    slice.dstHost = copy->dstHost;
    slice.dstDevice = copy->dstDevice;
    slice.dstArray = copy->dstArray;
    slice.dstPitch = copy->dstPitch;
    slice.WidthInBytes = copy->WidthInBytes;
    slice.Height = depth == 0 ? 0 : copy->Height;
    std::uint64_t srcRow = 0;
    std::uint64_t dstRow = 0;
    if (__builtin_mul_overflow(copy->srcZ + z, std::uint64_t{srcHeight}, &srcRow) ||
        __builtin_add_overflow(srcRow, std::uint64_t{copy->srcY}, &srcRow) ||
        __builtin_mul_overflow(copy->dstZ + z, std::uint64_t{dstHeight}, &dstRow) ||
        __builtin_add_overflow(dstRow, std::uint64_t{copy->dstY}, &dstRow)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    slice.srcY = static_cast<std::size_t>(srcRow);
    slice.dstY = static_cast<std::size_t>(dstRow);
    if (CUresult copied =
            memcpy2D(entryPoint, &slice, stream, nullStream, blocking && z + 1 == slices);
        copied != CUDA_SUCCESS) {
      return copied;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D* pCopy) {
  return memcpy3D(__func__, pCopy, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* pCopy) {
  return memcpy3D(__func__, pCopy, nullptr, NullStream::kPerThread, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return memcpy3D(__func__, pCopy, hStream, NullStream::kLegacy, false);
}

GPUPROXY_EXPORT CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return memcpy3D(__func__, pCopy, hStream, NullStream::kPerThread, false);
}
