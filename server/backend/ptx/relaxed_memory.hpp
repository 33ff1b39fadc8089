#pragma once
// How the sim touches memory that kernels share. Global memory is shared by every thread of a
// launch (blocks run on several workers), pinned host memory with the application, and device
// memory with the copies the device runs beside a kernel; kernels and copies race on it as they
// may on a GPU. Every such access is a relaxed atomic (one plain move on x86), so that a racing
// program has the outcomes a GPU allows and never makes the daemon's own behaviour undefined.
// The interpreter's loads and stores (ptx_ops_memory.cpp) and the sim's copies beside a kernel
// (sim_backend.cpp) both go through here.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpuproxy::server::ptx {

// One access of Word's width at `at`, which the caller has checked is aligned to it.
template <typename Word>
inline Word loadRelaxed(const std::byte* at) {
  return std::atomic_ref<Word>(*reinterpret_cast<Word*>(const_cast<std::byte*>(at)))
      .load(std::memory_order_relaxed);
}

template <typename Word>
inline void storeRelaxed(std::byte* at, Word value) {
  std::atomic_ref<Word>(*reinterpret_cast<Word*>(at)).store(value, std::memory_order_relaxed);
}

// memmove with relaxed accesses: 8 bytes at a time where source and destination share an
// alignment, else (and for a destination that overlaps the source ahead of it) byte by byte.
void copyRelaxed(std::byte* destination, const std::byte* source, std::size_t bytes);

// `count` elements of `elementSize` bytes (1, 2 or 4), each the low bytes of `value`,
// little-endian as a GPU stores them, with relaxed accesses.
void fillRelaxed(std::byte* destination, std::uint32_t value, unsigned elementSize,
                 std::size_t count);

}  // namespace gpuproxy::server::ptx
