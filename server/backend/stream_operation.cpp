#include "server/backend/stream_operation.hpp"

#include "protocol/overloaded.hpp"

#include <limits>

namespace gpuproxy::server::backend {

namespace {

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

bool validElementSize(unsigned elementSize) {
  return elementSize == 1 || elementSize == 2 || elementSize == 4;
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
            return DeviceRanges{
                {DeviceRange{memset.destination, std::uint64_t{memset.count} * memset.elementSize}},
                1};
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
                        [](const Memset& memset) {
                          if (!validElementSize(memset.elementSize))
                            return CUDA_ERROR_INVALID_VALUE;
                          // CUDA requires 16- and 32-bit memsets to start on an element boundary.
                          if (memset.destination % memset.elementSize != 0)
                            return CUDA_ERROR_INVALID_VALUE;
                          if (memset.count > kU64Max / memset.elementSize)
                            return CUDA_ERROR_INVALID_VALUE;
                          return CUDA_SUCCESS;
                        },
                    },
                    operation);
}

bool isEmpty(const MemoryOperation& operation) {
  return std::visit(protocol::Overloaded{
                        [](const Memset& memset) { return memset.count == 0; },
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
                    },
                    operation);
}

}  // namespace gpuproxy::server::backend
