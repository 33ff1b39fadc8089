#include "server/backend/stream_operation.hpp"

#include "protocol/overloaded.hpp"

#include <limits>

namespace gpuproxy::server::backend {

namespace {

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

bool validElementSize(unsigned elementSize) {
  return elementSize == 1 || elementSize == 2 || elementSize == 4;
}

CUresult checkMemset(const Memset& memset) {
  if (!validElementSize(memset.elementSize)) return CUDA_ERROR_INVALID_VALUE;
  // CUDA requires 16- and 32-bit memsets to start on an element boundary.
  if (memset.destination % memset.elementSize != 0) return CUDA_ERROR_INVALID_VALUE;
  if (memset.count > kU64Max / memset.elementSize) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult checkMemset2D(const Memset2D& memset) {
  if (!validElementSize(memset.elementSize)) return CUDA_ERROR_INVALID_VALUE;
  // Rows of 16- and 32-bit elements start on an element boundary: the destination and the pitch
  // are multiples of the element size.
  if (memset.destination % memset.elementSize != 0) return CUDA_ERROR_INVALID_VALUE;
  if (memset.width > kU64Max / memset.elementSize) return CUDA_ERROR_INVALID_VALUE;
  if (memset.height <= 1) return CUDA_SUCCESS;  // the pitch is not used
  const std::uint64_t rowBytes = std::uint64_t{memset.width} * memset.elementSize;
  if (memset.pitch % memset.elementSize != 0 || memset.pitch < rowBytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (memset.pitch > (kU64Max - rowBytes) / (memset.height - 1)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

}  // namespace

DeviceRanges deviceRanges(const MemoryOperation& operation) {
  return std::visit(
      protocol::Overloaded{
          [](const CopyHostToDevice& copy) {
            return DeviceRanges{{DeviceRange{copy.destination, copy.bytes}}, 1};
          },
          [](const CopyDeviceToHost& copy) {
            return DeviceRanges{{DeviceRange{copy.source, copy.bytes}}, 1};
          },
          [](const CopyDeviceToDevice& copy) {
            return DeviceRanges{
                {DeviceRange{copy.destination, copy.bytes}, DeviceRange{copy.source, copy.bytes}},
                2};
          },
          [](const Memset& memset) {
            const std::uint64_t bytes = std::uint64_t{memset.count} * memset.elementSize;
            return DeviceRanges{{DeviceRange{memset.destination, bytes}}, 1};
          },
          [](const Memset2D& memset) {
            // From the first row's start to the last row's end, the gaps between rows included:
            // the whole extent lies in one allocation, as the driver requires.
            const std::uint64_t rowBytes = std::uint64_t{memset.width} * memset.elementSize;
            const std::uint64_t extent =
                memset.height == 0 ? 0
                                   : std::uint64_t{memset.pitch} * (memset.height - 1) + rowBytes;
            return DeviceRanges{{DeviceRange{memset.destination, extent}}, 1};
          },
      },
      operation);
}

CUresult checkOperation(const MemoryOperation& operation) {
  return std::visit(protocol::Overloaded{
                        [](const CopyHostToDevice& copy) {
                          return copy.bytes != 0 && copy.source == nullptr
                                     ? CUDA_ERROR_INVALID_VALUE
                                     : CUDA_SUCCESS;
                        },
                        [](const CopyDeviceToHost& copy) {
                          return copy.bytes != 0 && copy.destination == nullptr
                                     ? CUDA_ERROR_INVALID_VALUE
                                     : CUDA_SUCCESS;
                        },
                        [](const CopyDeviceToDevice&) { return CUDA_SUCCESS; },
                        [](const Memset& memset) { return checkMemset(memset); },
                        [](const Memset2D& memset) { return checkMemset2D(memset); },
                    },
                    operation);
}

bool isEmpty(const MemoryOperation& operation) {
  return std::visit(
      protocol::Overloaded{
          [](const Memset& memset) { return memset.count == 0; },
          [](const Memset2D& memset) { return memset.width == 0 || memset.height == 0; },
          [](const auto& copy) { return copy.bytes == 0; },
      },
      operation);
}

std::string_view describe(const MemoryOperation& operation) {
  return std::visit(protocol::Overloaded{
                        [](const CopyHostToDevice&) { return "a host-to-device copy"; },
                        [](const CopyDeviceToHost&) { return "a device-to-host copy"; },
                        [](const CopyDeviceToDevice&) { return "a device-to-device copy"; },
                        [](const Memset&) { return "a memset"; },
                        [](const Memset2D&) { return "a 2D memset"; },
                    },
                    operation);
}

}  // namespace gpuproxy::server::backend
