#include "server/backend/ptx/relaxed_memory.hpp"

#include <cstring>

namespace gpuproxy::server::ptx {

namespace {

bool aligned8(const std::byte* at) {
  return (reinterpret_cast<std::uintptr_t>(at) & 7) == 0;
}

}  // namespace

void copyRelaxed(std::byte* destination, const std::byte* source, std::size_t bytes) {
  if (destination > source && destination < source + bytes) {
    // Overlapping, the destination after the source: from the end, as memmove does. Rare enough
    // to go byte by byte.
    for (std::size_t i = bytes; i-- > 0;) {
      storeRelaxed(destination + i, loadRelaxed<unsigned char>(source + i));
    }
    return;
  }
  std::size_t i = 0;
  if (((reinterpret_cast<std::uintptr_t>(destination) ^ reinterpret_cast<std::uintptr_t>(source)) &
       7) == 0) {
    for (; i < bytes && !aligned8(destination + i); ++i) {
      storeRelaxed(destination + i, loadRelaxed<unsigned char>(source + i));
    }
    for (; i + 8 <= bytes; i += 8) {
      storeRelaxed(destination + i, loadRelaxed<std::uint64_t>(source + i));
    }
  }
  for (; i < bytes; ++i) storeRelaxed(destination + i, loadRelaxed<unsigned char>(source + i));
}

void fillRelaxed(std::byte* destination, std::uint32_t value, unsigned elementSize,
                 std::size_t count) {
  unsigned char pattern[4];
  std::memcpy(pattern, &value, sizeof(pattern));
  const std::size_t bytes = count * elementSize;
  std::size_t i = 0;
  for (; i < bytes && !aligned8(destination + i); ++i) {
    storeRelaxed(destination + i, pattern[i % elementSize]);
  }
  if (i + 8 <= bytes) {
    // The element size divides 8, so every aligned word from here holds the same bytes.
    unsigned char bytesOfWord[8];
    for (std::size_t k = 0; k < 8; ++k) bytesOfWord[k] = pattern[(i + k) % elementSize];
    std::uint64_t word = 0;
    std::memcpy(&word, bytesOfWord, sizeof(word));
    for (; i + 8 <= bytes; i += 8) storeRelaxed(destination + i, word);
  }
  for (; i < bytes; ++i) storeRelaxed(destination + i, pattern[i % elementSize]);
}

}  // namespace gpuproxy::server::ptx
