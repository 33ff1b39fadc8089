#pragma once
// The operations that move or set device memory on a stream, described once: the session's
// executor builds them from ring records, the dispatcher holds them while a stream waits for the
// scheduler, and every backend executes them (backend::Stream::enqueue). Kernels, event records
// and waits, and host callbacks are not here: they carry callbacks and backend objects, and each
// has its own Stream method.
//
// Adding an operation: a struct here, its entry in MemoryOperation, its device ranges in
// deviceRanges() and its argument rules in checkOperation() (stream_operation.cpp), and a case
// in each backend's executor. Nothing in between needs to change.

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

namespace gpuproxy::server::backend {

struct CopyHostToDevice {
  CUdeviceptr destination = 0;
  const void* source = nullptr;  // must stay valid until the operation has completed
  std::size_t bytes = 0;
};

struct CopyDeviceToHost {
  void* destination = nullptr;  // must stay valid until the operation has completed
  CUdeviceptr source = 0;
  std::size_t bytes = 0;
};

struct CopyDeviceToDevice {
  CUdeviceptr destination = 0;
  CUdeviceptr source = 0;
  std::size_t bytes = 0;
};

// cuMemsetD8/D16/D32: `count` elements of `elementSize` (1, 2 or 4) bytes, each `value` (its low
// elementSize bytes).
struct Memset {
  CUdeviceptr destination = 0;
  std::uint32_t value = 0;
  unsigned elementSize = 1;
  std::size_t count = 0;
};

// cuMemsetD2D8/D2D16/D2D32: `height` rows of `width` elements of `elementSize` bytes, each row
// starting `pitch` bytes after the one before (the pitch does not matter with one row).
struct Memset2D {
  CUdeviceptr destination = 0;
  std::size_t pitch = 0;
  std::uint32_t value = 0;
  unsigned elementSize = 1;
  std::size_t width = 0;
  std::size_t height = 0;
};

using MemoryOperation =
    std::variant<CopyHostToDevice, CopyDeviceToHost, CopyDeviceToDevice, Memset, Memset2D>;

// A span of device addresses an operation reads or writes.
struct DeviceRange {
  CUdeviceptr pointer = 0;
  std::uint64_t bytes = 0;
};

// The device ranges `operation` touches (at most two; `count` says how many), for checking them
// against a client's allocations and remembering what in-flight work may touch. Only meaningful
// for an operation checkOperation() accepted.
struct DeviceRanges {
  std::array<DeviceRange, 2> ranges{};
  std::size_t count = 0;
};
DeviceRanges deviceRanges(const MemoryOperation& operation);

// CUDA's argument rules that do not depend on whose memory it is: element sizes, alignment, host
// pointers present, sizes that do not overflow. CUDA_ERROR_INVALID_VALUE when one is broken. The
// dispatcher and every backend check with this before queueing.
CUresult checkOperation(const MemoryOperation& operation);

// Whether the operation has nothing to do (zero bytes or elements): CUDA answers success without
// queueing anything.
bool isEmpty(const MemoryOperation& operation);

// "a host-to-device copy", ...: for logs.
std::string_view describe(const MemoryOperation& operation);

}  // namespace gpuproxy::server::backend
