#pragma once
// Handles a client holds for its contexts, streams, events, modules, functions and physical memory.
//
// A handle is [kind:8][device:8][serial:48]. The kind lets a stream handle passed where an event is
// expected fail as CUDA_ERROR_INVALID_HANDLE; the device routes a call to the right GPU; the serial
// comes from a per-session counter and is never reused, so a stale handle can never name a newer
// object. Handles are only ever looked up in the calling session's own tables.

#include <cstdint>
#include <optional>

namespace gpuproxy::server {

enum class HandleKind : std::uint8_t {
  kContext = 1,
  kStream = 2,
  kEvent = 3,
  kModule = 4,
  kFunction = 5,
  kPhysicalMemory = 6,  // cuMemCreate's CUmemGenericAllocationHandle
};

using Handle = std::uint64_t;

inline constexpr Handle makeHandle(HandleKind kind, std::uint32_t device, std::uint64_t serial) {
  return (static_cast<Handle>(kind) << 56) | (static_cast<Handle>(device & 0xff) << 48) |
         (serial & 0xffff'ffff'ffffull);
}

inline constexpr HandleKind handleKind(Handle handle) {
  return static_cast<HandleKind>(handle >> 56);
}

inline constexpr std::uint32_t handleDevice(Handle handle) {
  return static_cast<std::uint32_t>((handle >> 48) & 0xff);
}

// The device a handle of `kind` routes to, or nullopt when it is not a handle of that kind.
inline constexpr std::optional<std::uint32_t> deviceOf(Handle handle, HandleKind kind) {
  if (handleKind(handle) != kind) return std::nullopt;
  return handleDevice(handle);
}

}  // namespace gpuproxy::server
