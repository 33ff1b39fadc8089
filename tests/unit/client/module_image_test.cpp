// cuModuleLoadData gets only a pointer: the stub must find where a cubin, a fatbin or a PTX string
// ends before it can ship the image to the daemon. A wrong size sends a truncated module (the
// daemon rejects it) or reads past the application's buffer.

#include "client/stub/module_image.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using gpuproxy::stub::describeModuleImage;
using gpuproxy::stub::ModuleImageKind;

template <typename T>
void put(std::vector<unsigned char>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(value));
}

// A minimal ELF64 image: header, one PROGBITS section at 0x40..0x140, the section table at
// 0x140 with two 64-byte entries (the null section and the PROGBITS one).
std::vector<unsigned char> makeElf64() {
  std::vector<unsigned char> image(0x140 + 2 * 64, 0);
  image[0] = 0x7F;
  image[1] = 'E';
  image[2] = 'L';
  image[3] = 'F';
  image[4] = 2;                            // ELFCLASS64
  image[5] = 1;                            // little endian
  put<std::uint16_t>(image, 0x34, 64);     // e_ehsize
  put<std::uint64_t>(image, 0x28, 0x140);  // e_shoff
  put<std::uint16_t>(image, 0x3A, 64);     // e_shentsize
  put<std::uint16_t>(image, 0x3C, 2);      // e_shnum
  const std::size_t section = 0x140 + 64;
  put<std::uint32_t>(image, section + 4, 1);         // SHT_PROGBITS
  put<std::uint64_t>(image, section + 0x18, 0x40);   // sh_offset
  put<std::uint64_t>(image, section + 0x20, 0x100);  // sh_size
  return image;
}

TEST(ModuleImage, PtxIsItsStringWithTheTerminator) {
  const char ptx[] = ".version 8.0\n.target sm_75\n.address_size 64\n";
  auto image = describeModuleImage(ptx);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ModuleImageKind::kPtx);
  EXPECT_EQ(image->size, sizeof(ptx));
  EXPECT_EQ(image->data, ptx);
}

TEST(ModuleImage, ShortStringsAreNotReadPastTheirEnd) {
  const char tiny[] = "x";
  auto image = describeModuleImage(tiny);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->size, 2u);
}

TEST(ModuleImage, ElfEndsWithItsSectionTable) {
  std::vector<unsigned char> elf = makeElf64();
  auto image = describeModuleImage(elf.data());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ModuleImageKind::kElf);
  EXPECT_EQ(image->size, elf.size());
}

TEST(ModuleImage, ElfSectionBeyondTheTableCounts) {
  std::vector<unsigned char> elf = makeElf64();
  // Move the section's data after the table: the image now ends there.
  const std::size_t section = 0x140 + 64;
  put<std::uint64_t>(elf, section + 0x18, elf.size());
  put<std::uint64_t>(elf, section + 0x20, 0x80);
  const std::size_t expected = elf.size() + 0x80;
  elf.resize(expected, 0);
  auto image = describeModuleImage(elf.data());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->size, expected);
}

TEST(ModuleImage, ElfWithoutSectionTableIsRejected) {
  std::vector<unsigned char> elf = makeElf64();
  put<std::uint64_t>(elf, 0x28, 0);
  EXPECT_FALSE(describeModuleImage(elf.data()));
}

TEST(ModuleImage, FatbinIsHeaderPlusPayload) {
  std::vector<unsigned char> fatbin(16 + 100, 0xCC);
  put<std::uint32_t>(fatbin, 0, gpuproxy::stub::kFatbinMagic);
  put<std::uint16_t>(fatbin, 4, 1);
  put<std::uint16_t>(fatbin, 6, 16);
  put<std::uint64_t>(fatbin, 8, 100);
  auto image = describeModuleImage(fatbin.data());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ModuleImageKind::kFatbin);
  EXPECT_EQ(image->size, fatbin.size());
}

TEST(ModuleImage, FatbinWrapperPointsAtTheFatbin) {
  std::vector<unsigned char> fatbin(16 + 40, 0);
  put<std::uint32_t>(fatbin, 0, gpuproxy::stub::kFatbinMagic);
  put<std::uint16_t>(fatbin, 6, 16);
  put<std::uint64_t>(fatbin, 8, 40);
  struct Wrapper {
    std::uint32_t magic;
    std::uint32_t version;
    const void* data;
    void* filename;
  } wrapper{gpuproxy::stub::kFatbinWrapperMagic, 1, fatbin.data(), nullptr};
  auto image = describeModuleImage(&wrapper);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ModuleImageKind::kFatbin);
  EXPECT_EQ(image->data, fatbin.data());
  EXPECT_EQ(image->size, fatbin.size());
}

TEST(ModuleImage, WrapperWithoutFatbinIsRejected) {
  const char notFatbin[] = "plain text, not a fatbin";
  struct Wrapper {
    std::uint32_t magic;
    std::uint32_t version;
    const void* data;
    void* filename;
  } wrapper{gpuproxy::stub::kFatbinWrapperMagic, 1, notFatbin, nullptr};
  EXPECT_FALSE(describeModuleImage(&wrapper));
}

}  // namespace
