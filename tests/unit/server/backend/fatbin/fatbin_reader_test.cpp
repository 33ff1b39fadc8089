// The fatbin reader against nvcc 13's own output (tests/data/fatbin) and against images that lie:
// truncated, with sizes and offsets out of range, with compressed entries whose declared size is
// not what they hold. Every malformed image must come back as an error, never a crash.

#include "server/backend/fatbin/fatbin_reader.hpp"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "protocol/module_image.hpp"

namespace gpuproxy::server::fatbin {
namespace {

using Bytes = std::vector<std::byte>;

Bytes readSample(const std::string& name) {
  std::ifstream file(std::string(GPUPROXY_FATBIN_TEST_DATA) + "/" + name, std::ios::binary);
  EXPECT_TRUE(file) << name;
  const std::vector<char> chars((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  Bytes bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

template <typename T>
void poke(Bytes& bytes, std::size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const Bytes& bytes, std::size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

FatbinContents parseOrFail(std::span<const std::byte> image) {
  ParseResult<FatbinContents> result = parseFatbin(image);
  EXPECT_TRUE(result.ok()) << result.error;
  return result.ok() ? *result.value : FatbinContents{};
}

std::string ptxOrFail(std::span<const std::byte> image, unsigned deviceArch) {
  ParseResult<std::string> result = selectPtx(image, deviceArch);
  EXPECT_TRUE(result.ok()) << result.error;
  return result.ok() ? *result.value : std::string();
}

std::string errorOf(const ParseResult<std::string>& result) {
  EXPECT_FALSE(result.ok());
  EXPECT_FALSE(result.error.empty());
  return result.error;
}

// Entry header offsets, as nvcc lays them out (fatbin_reader.hpp).
constexpr std::size_t kFirstEntry = 16;
constexpr std::size_t kHeaderSizeField = 4;
constexpr std::size_t kPaddedSizeField = 8;
constexpr std::size_t kCompressedSizeField = 16;
constexpr std::size_t kFlagsField = 40;
constexpr std::size_t kUncompressedSizeField = 56;

// A fatbin built here, for what nvcc does not write: zstd frames without a content size,
// payloads of any declared size.
struct SyntheticEntry {
  std::uint16_t kind = 1;
  unsigned arch = 75;
  std::uint64_t flags = 0x11;
  Bytes payload;
  std::uint64_t uncompressedSize = 0;
};

Bytes makeFatbin(const std::vector<SyntheticEntry>& entries) {
  Bytes body;
  for (const SyntheticEntry& entry : entries) {
    const std::size_t padded = (entry.payload.size() + 7) / 8 * 8;
    const bool compressed = (entry.flags & (kFlagLz4 | kFlagZstd)) != 0;
    Bytes header(64);
    poke<std::uint16_t>(header, 0, entry.kind);
    poke<std::uint16_t>(header, 2, 0x0101);
    poke<std::uint32_t>(header, 4, 64);
    poke<std::uint64_t>(header, 8, padded);
    poke<std::uint32_t>(header, 16, compressed ? entry.payload.size() : 0);
    poke<std::uint16_t>(header, 26, 9);
    poke<std::uint32_t>(header, 28, entry.arch);
    poke<std::uint64_t>(header, 40, entry.flags);
    poke<std::uint64_t>(header, 56, compressed ? entry.uncompressedSize : 0);
    body.insert(body.end(), header.begin(), header.end());
    body.insert(body.end(), entry.payload.begin(), entry.payload.end());
    body.resize(body.size() + padded - entry.payload.size());
  }
  Bytes image(16);
  poke<std::uint32_t>(image, 0, protocol::kFatbinMagic);
  poke<std::uint16_t>(image, 4, 1);
  poke<std::uint16_t>(image, 6, 16);
  poke<std::uint64_t>(image, 8, body.size());
  image.insert(image.end(), body.begin(), body.end());
  return image;
}

Bytes asBytes(const std::string& text) {
  Bytes bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

const std::string kSmallPtx = ".version 9.0\n.target sm_75\n.address_size 64\n";

Bytes zstdWithoutContentSize(const std::string& text) {
  ZSTD_CCtx* context = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(context, ZSTD_c_contentSizeFlag, 0);
  Bytes output(ZSTD_compressBound(text.size()));
  ZSTD_outBuffer out{output.data(), output.size(), 0};
  ZSTD_inBuffer in{text.data(), text.size(), 0};
  const std::size_t left = ZSTD_compressStream2(context, &out, &in, ZSTD_e_end);
  ZSTD_freeCCtx(context);
  EXPECT_EQ(left, 0u);
  output.resize(out.pos);
  return output;
}

// A frame written as a stream of unknown length, so that it keeps the window asked for.
Bytes zstdWithWindowLog(const std::string& text, int windowLog) {
  ZSTD_CCtx* context = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(context, ZSTD_c_windowLog, windowLog);
  Bytes output(ZSTD_compressBound(text.size()) + 64);
  ZSTD_outBuffer out{output.data(), output.size(), 0};
  ZSTD_inBuffer in{text.data(), text.size(), 0};
  ZSTD_compressStream2(context, &out, &in, ZSTD_e_continue);
  ZSTD_inBuffer none{nullptr, 0, 0};
  const std::size_t left = ZSTD_compressStream2(context, &out, &none, ZSTD_e_end);
  ZSTD_freeCCtx(context);
  EXPECT_EQ(left, 0u);
  output.resize(out.pos);
  return output;
}

// --- nvcc's output --------------------------------------------------------------------------

TEST(FatbinReader, ReadsAnUncompressedElfAndPtx) {
  const Bytes image = readSample("nocompress_sm75.fatbin");
  const FatbinContents contents = parseOrFail(image);
  EXPECT_EQ(contents.size, image.size());
  ASSERT_EQ(contents.entries.size(), 2u);
  const FatbinEntry& elf = contents.entries[0];
  EXPECT_EQ(elf.kind, EntryKind::kElf);
  EXPECT_EQ(elf.arch, 75u);
  EXPECT_FALSE(elf.compressed);
  EXPECT_EQ(elf.flags, 0x11u);
  EXPECT_EQ(std::memcmp(image.data() + elf.payloadOffset, protocol::kElfMagic, 4), 0);
  const FatbinEntry& ptx = contents.entries[1];
  EXPECT_EQ(ptx.kind, EntryKind::kPtx);
  EXPECT_EQ(ptx.arch, 75u);
  EXPECT_EQ(ptx.variant, ArchVariant::kGeneric);
  EXPECT_EQ(ptx.ptxMajor, 9u);
  EXPECT_EQ(ptx.ptxMinor, 0u);
  EXPECT_FALSE(ptx.compressed);

  const std::string text = ptxOrFail(image, 75);
  EXPECT_NE(text.find(".target sm_75"), std::string::npos);
  EXPECT_NE(text.find(".entry scale"), std::string::npos);
  EXPECT_EQ(text.find('\0'), std::string::npos) << "the padding NULs are not PTX";
  EXPECT_EQ(text.back(), '\n');
}

TEST(FatbinReader, ZstdAndLz4PtxDecompressToTheUncompressedText) {
  const std::string plain = ptxOrFail(readSample("nocompress_sm75.fatbin"), 75);
  ASSERT_FALSE(plain.empty());

  const Bytes zstd = readSample("default_sm75.fatbin");  // nvcc 13's default: zstd PTX
  const FatbinContents zstdContents = parseOrFail(zstd);
  ASSERT_EQ(zstdContents.entries.size(), 2u);
  EXPECT_FALSE(zstdContents.entries[0].compressed) << "the default leaves the ELF alone";
  EXPECT_TRUE(zstdContents.entries[1].compressed);
  EXPECT_EQ(zstdContents.entries[1].flags, 0x8011u);
  EXPECT_EQ(zstdContents.entries[1].uncompressedSize, plain.size() + 1);  // with its NUL
  EXPECT_EQ(ptxOrFail(zstd, 75), plain);

  const Bytes lz4 = readSample("ptx_lz4.fatbin");  // --compress-mode=speed
  const FatbinContents lz4Contents = parseOrFail(lz4);
  ASSERT_EQ(lz4Contents.entries.size(), 1u);
  EXPECT_EQ(lz4Contents.entries[0].flags, 0x2011u);
  EXPECT_EQ(ptxOrFail(lz4, 75), plain);
  EXPECT_EQ(ptxOrFail(readSample("lz4_all.fatbin"), 75), plain);
  EXPECT_EQ(ptxOrFail(readSample("compress_all.fatbin"), 75), plain);
}

TEST(FatbinReader, CompressedElfPayloadsMatchTheUncompressedOnes) {
  const Bytes plainImage = readSample("nocompress_sm75.fatbin");
  const FatbinContents plain = parseOrFail(plainImage);
  const auto plainElf = readEntryPayload(plain, plain.entries[0], kDefaultMaxPtxBytes);
  ASSERT_TRUE(plainElf.ok()) << plainElf.error;
  for (const char* name : {"compress_all.fatbin", "lz4_all.fatbin"}) {
    const Bytes image = readSample(name);
    const FatbinContents contents = parseOrFail(image);
    ASSERT_EQ(contents.entries.size(), 2u) << name;
    EXPECT_EQ(contents.entries[0].kind, EntryKind::kElf) << name;
    EXPECT_TRUE(contents.entries[0].compressed) << name;
    const auto elf = readEntryPayload(contents, contents.entries[0], kDefaultMaxPtxBytes);
    ASSERT_TRUE(elf.ok()) << name << ": " << elf.error;
    EXPECT_EQ(*elf.value, *plainElf.value) << name;
  }
}

TEST(FatbinReader, PicksTheHighestPtxTheDeviceCanRun) {
  const Bytes image = readSample("multi_ptx_zstd.fatbin");  // compute_75, sm_80, compute_80
  const FatbinContents contents = parseOrFail(image);
  ASSERT_EQ(contents.entries.size(), 3u);
  EXPECT_NE(ptxOrFail(image, 75).find(".target sm_75"), std::string::npos);
  EXPECT_NE(ptxOrFail(image, 80).find(".target sm_80"), std::string::npos);
  EXPECT_NE(ptxOrFail(image, 86).find(".target sm_80"), std::string::npos);
  EXPECT_NE(ptxOrFail(image, 120).find(".target sm_80"), std::string::npos);
  EXPECT_EQ(errorOf(selectPtx(image, 70, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_70; the fatbin holds: compute_75 (PTX), sm_80 (ELF), "
            "compute_80 (PTX)");
}

TEST(FatbinReader, SassOnlyFatbinNamesTheArchitecturesItHolds) {
  const Bytes image = readSample("sass_only_compressed.fatbin");
  EXPECT_EQ(errorOf(selectPtx(image, 90, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_90; the fatbin holds: sm_75 (ELF), sm_80 (ELF)");
}

TEST(FatbinReader, ArchSpecificPtxRunsOnlyOnItsOwnArch) {
  Bytes image = readSample("ptx_90a_and_90.fatbin");  // compute_90a, then compute_90
  const FatbinContents contents = parseOrFail(image);
  ASSERT_EQ(contents.entries.size(), 2u);
  EXPECT_EQ(contents.entries[0].variant, ArchVariant::kArchSpecific);
  EXPECT_EQ(archName(contents.entries[0]), "sm_90a");
  EXPECT_EQ(contents.entries[1].variant, ArchVariant::kGeneric);
  // On a tie the generic PTX is preferred; on a later GPU only it can run.
  EXPECT_NE(ptxOrFail(image, 90).find(".target sm_90\n"), std::string::npos);
  EXPECT_NE(ptxOrFail(image, 100).find(".target sm_90\n"), std::string::npos);
  EXPECT_EQ(errorOf(selectPtx(image, 89, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_89; the fatbin holds: compute_90a (PTX), compute_90 (PTX)");

  // Without the generic entry (made an unknown kind), sm_90 takes the sm_90a PTX, sm_100 nothing.
  const std::size_t second =
      kFirstEntry + contents.entries[1].payloadOffset - contents.entries[0].payloadOffset;
  ASSERT_EQ(peek<std::uint16_t>(image, second), 1u);
  poke<std::uint16_t>(image, second, 4);
  EXPECT_NE(ptxOrFail(image, 90).find(".target sm_90a"), std::string::npos);
  EXPECT_EQ(errorOf(selectPtx(image, 100, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_100; the fatbin holds: compute_90a (PTX), sm_90 (kind 4)");
}

TEST(FatbinReader, FamilySpecificPtxRunsWithinItsMajorVersion) {
  Bytes image = makeFatbin(
      {{.arch = 100, .flags = 0x11 | kFlagFamilySpecific, .payload = asBytes(kSmallPtx)}});
  EXPECT_EQ(ptxOrFail(image, 100), kSmallPtx);
  EXPECT_EQ(ptxOrFail(image, 103), kSmallPtx);
  EXPECT_EQ(errorOf(selectPtx(image, 120, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_120; the fatbin holds: compute_100f (PTX)");
}

TEST(FatbinReader, SkipsEntriesOfUnknownKinds) {
  const Bytes image = readSample("lto_and_ptx.fatbin");  // compute_75 PTX and lto_75 (kind 8)
  const FatbinContents contents = parseOrFail(image);
  ASSERT_EQ(contents.entries.size(), 2u);
  EXPECT_EQ(contents.entries[1].kind, EntryKind::kOther);
  EXPECT_EQ(contents.entries[1].rawKind, 8u);
  EXPECT_TRUE(contents.entries[1].compressed);
  EXPECT_FALSE(readEntryPayload(contents, contents.entries[1], kDefaultMaxPtxBytes).ok());
  EXPECT_NE(ptxOrFail(image, 75).find(".entry scale"), std::string::npos);

  Bytes unknown = readSample("nocompress_sm75.fatbin");
  const std::size_t ptxEntry = kFirstEntry + 64 + 3112;
  ASSERT_EQ(peek<std::uint16_t>(unknown, ptxEntry), 1u);
  poke<std::uint16_t>(unknown, ptxEntry, 4);
  EXPECT_EQ(errorOf(selectPtx(unknown, 75, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_75; the fatbin holds: sm_75 (ELF), sm_75 (kind 4)");
}

TEST(FatbinReader, IgnoresBytesAfterTheFatbin) {
  // The .nv_fatbin section of a program nvcc built: two fatbins back to back.
  const Bytes section = readSample("two_fatbins_section.bin");
  const FatbinContents first = parseOrFail(section);
  ASSERT_LT(first.size, section.size());
  ASSERT_EQ(first.entries.size(), 1u);
  EXPECT_EQ(first.entries[0].kind, EntryKind::kElf);
  EXPECT_EQ(errorOf(selectPtx(section, 75, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_75; the fatbin holds: sm_75 (ELF)");

  const std::span<const std::byte> second = std::span(section).subspan(first.size);
  const FatbinContents contents = parseOrFail(second);
  ASSERT_EQ(contents.entries.size(), 2u);
  EXPECT_EQ(first.size + contents.size, section.size());
  EXPECT_NE(ptxOrFail(second, 75).find(".entry _Z3addPKfS0_Pfi"), std::string::npos);
}

TEST(FatbinReader, FollowsAWrapperOnlyWhenTheCallerOwnsIt) {
  const Bytes fatbin = readSample("default_sm75.fatbin");
  struct {
    std::uint32_t magic;
    std::uint32_t version;
    const void* data;
    const void* filename;
  } wrapper{protocol::kFatbinWrapperMagic, 1, fatbin.data(), nullptr};
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(&wrapper),
                                         sizeof(wrapper));

  const ParseResult<FatbinContents> refused = parseFatbin(image);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("wrapper"), std::string::npos) << refused.error;
  EXPECT_FALSE(selectPtx(image, 75).ok());

  const ParseResult<FatbinContents> followed =
      parseFatbin(image, WrapperPolicy::kFollowInThisProcess);
  ASSERT_TRUE(followed.ok()) << followed.error;
  EXPECT_EQ(followed.value->bytes.data(), fatbin.data());
  EXPECT_EQ(followed.value->size, fatbin.size());
  const ParseResult<std::string> text = selectPtx(*followed.value, 75);
  ASSERT_TRUE(text.ok()) << text.error;
  EXPECT_EQ(*text.value, ptxOrFail(fatbin, 75));

  wrapper.version = 3;
  EXPECT_FALSE(parseFatbin(image, WrapperPolicy::kFollowInThisProcess).ok());
  wrapper.version = 2;
  wrapper.data = nullptr;
  EXPECT_FALSE(parseFatbin(image, WrapperPolicy::kFollowInThisProcess).ok());
  const std::uint32_t notFatbin[4] = {0x12345678, 0, 0, 0};
  wrapper.data = notFatbin;
  EXPECT_FALSE(parseFatbin(image, WrapperPolicy::kFollowInThisProcess).ok());
  EXPECT_FALSE(parseFatbin(image.first(20), WrapperPolicy::kFollowInThisProcess).ok());
}

// --- hostile images -------------------------------------------------------------------------

TEST(FatbinReader, EveryTruncationIsAnError) {
  for (const char* name :
       {"nocompress_sm75.fatbin", "default_sm75.fatbin", "ptx_lz4.fatbin", "compress_all.fatbin",
        "multi_ptx_zstd.fatbin", "lto_and_ptx.fatbin", "ptx_90a_and_90.fatbin"}) {
    const Bytes image = readSample(name);
    ASSERT_TRUE(parseFatbin(image).ok()) << name;
    for (std::size_t length = 0; length < image.size(); ++length) {
      const std::span<const std::byte> truncated(image.data(), length);
      const ParseResult<FatbinContents> parsed = parseFatbin(truncated);
      EXPECT_FALSE(parsed.ok()) << name << " cut to " << length;
      EXPECT_FALSE(parsed.error.empty());
      EXPECT_FALSE(selectPtx(truncated, 90).ok()) << name << " cut to " << length;
    }
  }
}

TEST(FatbinReader, RefusesBadFatbinHeaders) {
  const Bytes good = readSample("ptx_lz4.fatbin");
  EXPECT_EQ(parseFatbin({}).error, "image of 0 bytes is too short for a fatbin");
  EXPECT_EQ(parseFatbin(asBytes(kSmallPtx)).error, "not a fatbin (magic 0x7265762e)");

  Bytes image = good;
  poke<std::uint16_t>(image, 4, 2);
  EXPECT_EQ(parseFatbin(image).error, "fatbin version 2 is not supported (only 1 is)");
  for (const std::uint16_t headerSize : {0, 8, 15, 0xFFFF}) {
    image = good;
    poke<std::uint16_t>(image, 6, headerSize);
    EXPECT_FALSE(parseFatbin(image).ok()) << headerSize;
  }
  for (const std::uint64_t entriesSize : {std::uint64_t{good.size() - 15}, std::uint64_t{1} << 40,
                                          ~std::uint64_t{0}, ~std::uint64_t{0} - 15}) {
    image = good;
    poke<std::uint64_t>(image, 8, entriesSize);
    EXPECT_FALSE(parseFatbin(image).ok()) << entriesSize;
  }
  // Entries shorter than the fatbin declares leave a partial entry header.
  image = good;
  poke<std::uint64_t>(image, 8, 32);
  EXPECT_EQ(parseFatbin(image).error,
            "fatbin entry 0 at offset 0x10: header truncated (32 of 64 bytes)");
  // No entries at all is a fatbin, with no PTX.
  image = good;
  poke<std::uint64_t>(image, 8, 0);
  EXPECT_TRUE(parseFatbin(image).ok());
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "no PTX entry for sm_75; the fatbin holds no entries");
}

TEST(FatbinReader, RefusesEntrySizesAndOffsetsOutOfRange) {
  const Bytes good = readSample("default_sm75.fatbin");
  const std::size_t ptxEntry = kFirstEntry + 64 + 3112;
  const std::vector<std::uint64_t> hostile = {
      0, 1, 63, 0x41, 0xFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x100000000, 1ull << 62, ~0ull};
  for (const std::size_t entry : {kFirstEntry, ptxEntry}) {
    for (const std::uint64_t value : hostile) {
      Bytes image = good;
      poke<std::uint32_t>(image, entry + kHeaderSizeField, static_cast<std::uint32_t>(value));
      (void)parseFatbin(image);
      (void)selectPtx(image, 75);
      image = good;
      poke<std::uint64_t>(image, entry + kPaddedSizeField, value);
      (void)parseFatbin(image);
      (void)selectPtx(image, 75);
      image = good;
      poke<std::uint32_t>(image, entry + kCompressedSizeField, static_cast<std::uint32_t>(value));
      (void)selectPtx(image, 75);
      image = good;
      poke<std::uint64_t>(image, entry + kUncompressedSizeField, value);
      (void)selectPtx(image, 75);
    }
  }
  Bytes image = good;
  poke<std::uint32_t>(image, ptxEntry + kHeaderSizeField, 8);
  EXPECT_EQ(parseFatbin(image).error,
            "fatbin entry 1 at offset 0xc78: header size 8 is out of range (64 to 432)");
  image = good;
  poke<std::uint64_t>(image, ptxEntry + kPaddedSizeField, 360);
  EXPECT_EQ(parseFatbin(image).error,
            "fatbin entry 1 at offset 0xc78: payload of 360 bytes runs past the end of the "
            "fatbin (352 bytes left)");
  image = good;
  poke<std::uint64_t>(image, kFirstEntry + kPaddedSizeField, 3112 + 8);
  EXPECT_FALSE(parseFatbin(image).ok());
  image = good;
  poke<std::uint32_t>(image, ptxEntry + kCompressedSizeField, 353);
  EXPECT_EQ(parseFatbin(image).error,
            "fatbin entry 1 at offset 0xc78: compressed size 353 is out of range (1 to the "
            "payload's 352 bytes)");
  image = good;
  poke<std::uint32_t>(image, ptxEntry + kCompressedSizeField, 0);
  EXPECT_FALSE(parseFatbin(image).ok());
  image = good;
  poke<std::uint64_t>(image, ptxEntry + kFlagsField, 0x11 | kFlagLz4 | kFlagZstd);
  EXPECT_EQ(parseFatbin(image).error,
            "fatbin entry 1 at offset 0xc78: flags 0xa011 name both LZ4 and zstd compression");
  // A compressed size shorter than the frame cuts it.
  image = good;
  poke<std::uint32_t>(image, ptxEntry + kCompressedSizeField, 100);
  EXPECT_FALSE(selectPtx(image, 75).ok());
}

TEST(FatbinReader, RefusesACompressedEntryThatLiesAboutItsSize) {
  // zstd, whose frame says how much it holds.
  const Bytes zstd = readSample("default_sm75.fatbin");
  const std::size_t zstdEntry = kFirstEntry + 64 + 3112;
  ASSERT_EQ(peek<std::uint64_t>(zstd, zstdEntry + kUncompressedSizeField), 668u);
  Bytes image = zstd;
  poke<std::uint64_t>(image, zstdEntry + kUncompressedSizeField, 600);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): zstd frame holds 668 bytes but the entry declares "
            "600");
  poke<std::uint64_t>(image, zstdEntry + kUncompressedSizeField, 700);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): zstd frame holds 668 bytes but the entry declares "
            "700");

  // zstd without a content size in its frame: found out by decompressing.
  const Bytes frame = zstdWithoutContentSize(kSmallPtx);
  const auto zstdFatbin = [&](std::uint64_t declared) {
    return makeFatbin(
        {{.flags = 0x11 | kFlagZstd, .payload = frame, .uncompressedSize = declared}});
  };
  EXPECT_EQ(ptxOrFail(zstdFatbin(kSmallPtx.size()), 75), kSmallPtx);
  EXPECT_EQ(errorOf(selectPtx(zstdFatbin(kSmallPtx.size() - 1), 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): zstd payload decompresses to more than the "
            "declared 43 bytes");
  EXPECT_EQ(errorOf(selectPtx(zstdFatbin(20), 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): zstd payload decompresses to more than the "
            "declared 20 bytes");
  EXPECT_EQ(errorOf(selectPtx(zstdFatbin(kSmallPtx.size() + 1), 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): zstd payload decompresses to 44 bytes, not the "
            "declared 45 bytes");

  // A frame asking for a 128 MiB window decodes within the declared size: one-shot
  // decompression keeps its window in the output buffer.
  const Bytes wide = zstdWithWindowLog(kSmallPtx, 27);
  EXPECT_EQ(
      ptxOrFail(
          makeFatbin(
              {{.flags = 0x11 | kFlagZstd, .payload = wide, .uncompressedSize = kSmallPtx.size()}}),
          75),
      kSmallPtx);

  // LZ4, whose blocks carry no size at all.
  const Bytes lz4 = readSample("ptx_lz4.fatbin");
  ASSERT_EQ(peek<std::uint64_t>(lz4, kFirstEntry + kUncompressedSizeField), 668u);
  image = lz4;
  poke<std::uint64_t>(image, kFirstEntry + kUncompressedSizeField, 667);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): LZ4 payload decompresses to more than the declared "
            "667 bytes");
  poke<std::uint64_t>(image, kFirstEntry + kUncompressedSizeField, 600);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): LZ4 payload is corrupt or decompresses to more "
            "than the declared 600 bytes");
  poke<std::uint64_t>(image, kFirstEntry + kUncompressedSizeField, 700);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): LZ4 payload decompresses to 668 bytes, not the "
            "declared 700 bytes");
  poke<std::uint64_t>(image, kFirstEntry + kUncompressedSizeField, 1 << 20);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): LZ4 payload of 445 bytes cannot decompress to the "
            "declared 1048576 bytes");
  poke<std::uint64_t>(image, kFirstEntry + kUncompressedSizeField, 0);
  EXPECT_FALSE(selectPtx(image, 75).ok());
}

TEST(FatbinReader, RefusesPtxOverTheCallersLimit) {
  const Bytes zstd = readSample("default_sm75.fatbin");
  EXPECT_EQ(errorOf(selectPtx(zstd, 75, 667)),
            "PTX entry for compute_75 (PTX): entry declares 668 bytes uncompressed, over the "
            "limit of 667");
  EXPECT_TRUE(selectPtx(zstd, 75, 668).ok());

  const Bytes plain = readSample("nocompress_sm75.fatbin");
  EXPECT_EQ(errorOf(selectPtx(plain, 75, 100)),
            "PTX entry for compute_75 (PTX): entry holds 672 bytes, over the limit of 100");

  // A bomb: a few bytes declaring a terabyte are refused before anything is allocated.
  Bytes image = zstd;
  poke<std::uint64_t>(image, kFirstEntry + 64 + 3112 + kUncompressedSizeField, 1ull << 40);
  EXPECT_EQ(errorOf(selectPtx(image, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX): entry declares 1099511627776 bytes uncompressed, "
            "over the limit of 67108864");

  // A real bomb: 64 MiB of zeros, squeezed by zstd, declared truthfully, over a 1 MiB limit.
  const std::string zeros(64 << 20, '\0');
  Bytes frame(ZSTD_compressBound(zeros.size()));
  frame.resize(ZSTD_compress(frame.data(), frame.size(), zeros.data(), zeros.size(), 1));
  ASSERT_LT(frame.size(), 1u << 16);
  const Bytes bomb =
      makeFatbin({{.flags = 0x11 | kFlagZstd, .payload = frame, .uncompressedSize = zeros.size()}});
  EXPECT_FALSE(selectPtx(bomb, 75, 1 << 20).ok());
  // Within the limit it decompresses, and PTX of nothing but NULs is no PTX.
  EXPECT_EQ(errorOf(selectPtx(bomb, 75, kDefaultMaxPtxBytes)),
            "PTX entry for compute_75 (PTX) is empty");
}

TEST(FatbinReader, RefusesAnEntryPayloadOutsideItsFatbin) {
  const Bytes image = readSample("nocompress_sm75.fatbin");
  const FatbinContents contents = parseOrFail(image);
  FatbinEntry entry = contents.entries[1];
  entry.payloadOffset = image.size() - 10;
  EXPECT_FALSE(readEntryPayload(contents, entry, kDefaultMaxPtxBytes).ok());
  entry.payloadOffset = ~std::uint64_t{0};
  EXPECT_FALSE(readEntryPayload(contents, entry, kDefaultMaxPtxBytes).ok());
}

TEST(FatbinReader, SurvivesEverySingleByteCorruption) {
  for (const char* name : {"ptx_lz4.fatbin", "ptx_90a_and_90.fatbin"}) {
    const Bytes good = readSample(name);
    for (std::size_t offset = 0; offset < good.size(); ++offset) {
      for (const unsigned char mask : {0x01, 0x80, 0xFF}) {
        Bytes image = good;
        image[offset] ^= std::byte{mask};
        const ParseResult<FatbinContents> parsed = parseFatbin(image);
        EXPECT_NE(parsed.ok(), !parsed.error.empty());
        for (const unsigned arch : {75u, 90u, 100u}) {
          const ParseResult<std::string> ptx = selectPtx(image, arch, 1 << 20);
          EXPECT_NE(ptx.ok(), !ptx.error.empty());
        }
      }
    }
  }
}

}  // namespace
}  // namespace gpuproxy::server::fatbin
