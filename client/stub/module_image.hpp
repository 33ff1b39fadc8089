#pragma once
// How many bytes a module image handed to cuModuleLoadData spans. The driver API passes only a
// pointer, so the stub must find the end itself before it can ship the image to the daemon.
// Header-only and free of stub state so that unit tests can exercise it directly.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "protocol/module_image.hpp"

namespace gpuproxy::stub {

enum class ModuleImageKind { kElf, kFatbin, kPtx };

struct ModuleImage {
  const void* data = nullptr;  // where the bytes to ship start (a wrapper points elsewhere)
  std::size_t size = 0;        // bytes, including the terminating NUL for PTX
  ModuleImageKind kind = ModuleImageKind::kPtx;
};

using protocol::kFatbinMagic;
using protocol::kFatbinWrapperMagic;

namespace detail {

template <typename T>
T loadUnaligned(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

// The end of an ELF image is not in its header; it is the furthest byte that a header, the
// section table, a section or a program segment reaches. Cubins put the section table last, but
// taking the maximum does not rely on that.
inline std::optional<std::size_t> elfSize(const unsigned char* image) {
  constexpr unsigned char kClass32 = 1;
  constexpr unsigned char kClass64 = 2;
  constexpr std::uint32_t kSectionNoBits = 8;  // SHT_NOBITS occupies no file bytes
  const unsigned char elfClass = image[4];
  if (elfClass != kClass32 && elfClass != kClass64) return std::nullopt;
  const bool is64 = elfClass == kClass64;

  const std::uint64_t headerSize = loadUnaligned<std::uint16_t>(image + (is64 ? 0x34 : 0x28));
  const std::uint64_t phoff = is64 ? loadUnaligned<std::uint64_t>(image + 0x20)
                                   : loadUnaligned<std::uint32_t>(image + 0x1C);
  const std::uint64_t shoff = is64 ? loadUnaligned<std::uint64_t>(image + 0x28)
                                   : loadUnaligned<std::uint32_t>(image + 0x20);
  const std::uint64_t phentsize = loadUnaligned<std::uint16_t>(image + (is64 ? 0x36 : 0x2A));
  const std::uint64_t phnum = loadUnaligned<std::uint16_t>(image + (is64 ? 0x38 : 0x2C));
  const std::uint64_t shentsize = loadUnaligned<std::uint16_t>(image + (is64 ? 0x3A : 0x2E));
  const std::uint64_t shnum = loadUnaligned<std::uint16_t>(image + (is64 ? 0x3C : 0x30));
  if (shoff == 0 || shnum == 0 || shentsize == 0) return std::nullopt;
  // Plausibility bound: a header field this large is garbage, not a 1 TiB cubin.
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 40;
  if (shoff > kLimit || phoff > kLimit) return std::nullopt;

  std::uint64_t end = headerSize;
  end = std::max(end, shoff + shentsize * shnum);
  if (phoff != 0) end = std::max(end, phoff + phentsize * phnum);
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const unsigned char* section = image + shoff + i * shentsize;
    const std::uint32_t type = loadUnaligned<std::uint32_t>(section + 4);
    if (type == kSectionNoBits) continue;
    const std::uint64_t offset = is64 ? loadUnaligned<std::uint64_t>(section + 0x18)
                                      : loadUnaligned<std::uint32_t>(section + 0x10);
    const std::uint64_t size = is64 ? loadUnaligned<std::uint64_t>(section + 0x20)
                                    : loadUnaligned<std::uint32_t>(section + 0x14);
    if (offset > kLimit || size > kLimit) return std::nullopt;
    end = std::max(end, offset + size);
  }
  for (std::uint64_t i = 0; phoff != 0 && i < phnum; ++i) {
    const unsigned char* segment = image + phoff + i * phentsize;
    const std::uint64_t offset = is64 ? loadUnaligned<std::uint64_t>(segment + 0x08)
                                      : loadUnaligned<std::uint32_t>(segment + 0x04);
    const std::uint64_t size = is64 ? loadUnaligned<std::uint64_t>(segment + 0x20)
                                    : loadUnaligned<std::uint32_t>(segment + 0x10);
    if (offset > kLimit || size > kLimit) return std::nullopt;
    end = std::max(end, offset + size);
  }
  return static_cast<std::size_t>(end);
}

}  // namespace detail

// nullopt when the image has a recognised binary header that makes no sense. Anything without a
// binary magic number is taken as NUL-terminated PTX, which is what the driver does too.
inline std::optional<ModuleImage> describeModuleImage(const void* image) {
  const auto* bytes = static_cast<const unsigned char*>(image);
  // Every magic number has four non-zero bytes, so a NUL among the first four means a (short) PTX
  // string, and reading stops there: a two-byte string is not read past its end.
  for (int i = 0; i < 4; ++i) {
    if (bytes[i] == 0) return ModuleImage{image, std::size_t(i) + 1, ModuleImageKind::kPtx};
  }
  const std::uint32_t magic = detail::loadUnaligned<std::uint32_t>(bytes);
  if (magic == kFatbinWrapperMagic) {
    // struct { int magic; int version; const unsigned long long* data; void* filename; }
    const void* data = detail::loadUnaligned<const void*>(bytes + 8);
    if (data == nullptr || data == image) return std::nullopt;
    const auto* inner = static_cast<const unsigned char*>(data);
    if (detail::loadUnaligned<std::uint32_t>(inner) != kFatbinMagic) return std::nullopt;
    return describeModuleImage(data);
  }
  if (magic == kFatbinMagic) {
    // struct { u32 magic; u16 version; u16 headerSize; u64 fatSize; }
    const std::uint16_t headerSize = detail::loadUnaligned<std::uint16_t>(bytes + 6);
    const std::uint64_t fatSize = detail::loadUnaligned<std::uint64_t>(bytes + 8);
    if (headerSize < 16 || fatSize > (std::uint64_t{1} << 40)) return std::nullopt;
    return ModuleImage{image, static_cast<std::size_t>(headerSize + fatSize),
                       ModuleImageKind::kFatbin};
  }
  if (std::memcmp(bytes, protocol::kElfMagic, sizeof(protocol::kElfMagic)) == 0) {
    std::optional<std::size_t> size = detail::elfSize(bytes);
    if (!size) return std::nullopt;
    return ModuleImage{image, *size, ModuleImageKind::kElf};
  }
  return ModuleImage{image, std::strlen(static_cast<const char*>(image)) + 1,
                     ModuleImageKind::kPtx};
}

}  // namespace gpuproxy::stub
