#pragma once
// CUDA arrays as the rest of the stub sees them (textures.cpp owns them): device memory of the
// client's in a dense layout, element (x, y, z) at base + ((z * height + y) * width + x) *
// elementBytes. Copies to and from an array are copies of that memory (memcpy_2d.cpp).

#include <cuda.h>

#include <cstdint>
#include <optional>

namespace gpuproxy::stub {

struct ArrayLayout {
  CUdeviceptr base = 0;
  std::uint64_t pitch = 0;   // bytes of one row: width * elementBytes
  std::uint64_t height = 1;  // rows of one slice (1 for a 1D array)
  std::uint64_t rows = 1;    // rows of all slices: height * depth
  std::uint64_t bytes = 0;   // the whole array
};

// The layout of an array this process has, or nullopt.
std::optional<ArrayLayout> arrayLayout(CUarray array);

}  // namespace gpuproxy::stub
