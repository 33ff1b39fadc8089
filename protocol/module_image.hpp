#pragma once
// What a module image handed to cuModuleLoadData is, from its first bytes: a cubin (ELF), a
// fatbin (the data, or the __fatBinC_Wrapper_t that points at it), or else PTX text. The magic
// numbers are defined here and nowhere else; the stub, the backends and the fatbin reader use
// them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace gpuproxy::protocol {

inline constexpr unsigned char kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;         // fatbin data header
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;  // __fatBinC_Wrapper_t

enum class ModuleImageKind { kElf, kFatbin, kFatbinWrapper, kPtx };

// The kind of image `bytes` starts with; kPtx when it starts with no magic of a binary image.
inline ModuleImageKind moduleImageKind(std::span<const std::byte> bytes) {
  if (bytes.size() >= sizeof(kElfMagic) && std::memcmp(bytes.data(), kElfMagic, 4) == 0) {
    return ModuleImageKind::kElf;
  }
  if (bytes.size() >= sizeof(std::uint32_t)) {
    std::uint32_t magic = 0;  // little-endian, as the toolkit writes it
    std::memcpy(&magic, bytes.data(), sizeof(magic));
    if (magic == kFatbinMagic) return ModuleImageKind::kFatbin;
    if (magic == kFatbinWrapperMagic) return ModuleImageKind::kFatbinWrapper;
  }
  return ModuleImageKind::kPtx;
}

}  // namespace gpuproxy::protocol
