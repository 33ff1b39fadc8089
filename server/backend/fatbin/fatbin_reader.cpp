#include "server/backend/fatbin/fatbin_reader.hpp"

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "protocol/module_image.hpp"

namespace gpuproxy::server::fatbin {
namespace {

constexpr std::size_t kFatbinHeaderBytes = 16;
constexpr std::uint16_t kFatbinVersion = 1;
constexpr std::size_t kWrapperBytes = 24;
constexpr std::size_t kEntryHeaderBytes = 64;  // the fields read; PTX headers are longer
constexpr std::uint16_t kKindPtx = 1;
constexpr std::uint16_t kKindElf = 2;
// A wrapper in this process points at a fatbin the program itself carries; one claiming more
// than this is corrupt rather than large.
constexpr std::uint64_t kMaxFollowedFatbinBytes = std::uint64_t{1} << 32;

template <typename T>
T load(std::span<const std::byte> bytes, std::size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}

std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string describeHolding(const FatbinEntry& entry) {
  switch (entry.kind) {
    case EntryKind::kPtx: {
      std::string name = archName(entry);
      return "compute_" + name.substr(3) + " (PTX)";
    }
    case EntryKind::kElf:
      return archName(entry) + " (ELF)";
    case EntryKind::kOther:
      break;
  }
  return archName(entry) + " (kind " + std::to_string(entry.rawKind) + ")";
}

// Reads the entries of a fatbin whose header, at least, lies within `image`.
ParseResult<FatbinContents> parseFatbinData(std::span<const std::byte> image) {
  if (image.size() < kFatbinHeaderBytes) {
    return ParseResult<FatbinContents>::failure(
        "fatbin header truncated: " + std::to_string(image.size()) + " of " +
        std::to_string(kFatbinHeaderBytes) + " bytes");
  }
  const auto version = load<std::uint16_t>(image, 4);
  const std::uint64_t headerSize = load<std::uint16_t>(image, 6);
  const auto entriesSize = load<std::uint64_t>(image, 8);
  if (version != kFatbinVersion) {
    return ParseResult<FatbinContents>::failure("fatbin version " + std::to_string(version) +
                                                " is not supported (only 1 is)");
  }
  if (headerSize < kFatbinHeaderBytes || headerSize > image.size()) {
    return ParseResult<FatbinContents>::failure("fatbin header size " + std::to_string(headerSize) +
                                                " is out of range (16 to " +
                                                std::to_string(image.size()) + ")");
  }
  if (entriesSize > image.size() - headerSize) {
    return ParseResult<FatbinContents>::failure(
        "fatbin declares " + std::to_string(entriesSize) + " bytes of entries but the image has " +
        std::to_string(image.size() - headerSize) + " after its header");
  }

  FatbinContents contents;
  contents.size = static_cast<std::size_t>(headerSize + entriesSize);
  contents.bytes = image.first(contents.size);
  const std::span<const std::byte> bytes = contents.bytes;
  std::uint64_t offset = headerSize;
  while (offset < bytes.size()) {
    const std::uint64_t left = bytes.size() - offset;
    const std::string where =
        "fatbin entry " + std::to_string(contents.entries.size()) + " at offset " + hex(offset);
    if (left < kEntryHeaderBytes) {
      return ParseResult<FatbinContents>::failure(where + ": header truncated (" +
                                                  std::to_string(left) + " of " +
                                                  std::to_string(kEntryHeaderBytes) + " bytes)");
    }
    const std::span<const std::byte> header = bytes.subspan(offset, kEntryHeaderBytes);
    const auto rawKind = load<std::uint16_t>(header, 0);
    const std::uint64_t entryHeaderSize = load<std::uint32_t>(header, 4);
    const auto paddedSize = load<std::uint64_t>(header, 8);
    const std::uint64_t compressedSize = load<std::uint32_t>(header, 16);
    const auto flags = load<std::uint64_t>(header, 40);
    const auto uncompressedSize = load<std::uint64_t>(header, 56);
    if (entryHeaderSize < kEntryHeaderBytes || entryHeaderSize > left) {
      return ParseResult<FatbinContents>::failure(
          where + ": header size " + std::to_string(entryHeaderSize) + " is out of range (64 to " +
          std::to_string(left) + ")");
    }
    if (paddedSize > left - entryHeaderSize) {
      return ParseResult<FatbinContents>::failure(
          where + ": payload of " + std::to_string(paddedSize) + " bytes runs past the end of " +
          "the fatbin (" + std::to_string(left - entryHeaderSize) + " bytes left)");
    }

    FatbinEntry entry;
    entry.rawKind = rawKind;
    entry.kind = rawKind == kKindPtx   ? EntryKind::kPtx
                 : rawKind == kKindElf ? EntryKind::kElf
                                       : EntryKind::kOther;
    entry.ptxMinor = load<std::uint16_t>(header, 24);
    entry.ptxMajor = load<std::uint16_t>(header, 26);
    entry.arch = load<std::uint32_t>(header, 28);
    entry.flags = flags;
    entry.variant = (flags & kFlagArchSpecific) != 0     ? ArchVariant::kArchSpecific
                    : (flags & kFlagFamilySpecific) != 0 ? ArchVariant::kFamilySpecific
                                                         : ArchVariant::kGeneric;
    entry.payloadOffset = offset + entryHeaderSize;
    entry.compressed = (flags & (kFlagLz4 | kFlagZstd)) != 0;
    // Entries of kinds this reader does not know are skipped whole: their flags may mean
    // something else (nvcc's LTO IR sets the zstd bit on bytes that are no zstd frame).
    if (entry.compressed && entry.kind != EntryKind::kOther) {
      if ((flags & kFlagLz4) != 0 && (flags & kFlagZstd) != 0) {
        return ParseResult<FatbinContents>::failure(where + ": flags " + hex(flags) +
                                                    " name both LZ4 and zstd compression");
      }
      if (compressedSize == 0 || compressedSize > paddedSize) {
        return ParseResult<FatbinContents>::failure(
            where + ": compressed size " + std::to_string(compressedSize) +
            " is out of range (1 to the payload's " + std::to_string(paddedSize) + " bytes)");
      }
      entry.payloadSize = compressedSize;
      entry.uncompressedSize = uncompressedSize;
    } else {
      entry.payloadSize = paddedSize;
      entry.uncompressedSize = entry.compressed ? uncompressedSize : paddedSize;
    }
    contents.entries.push_back(entry);
    offset += entryHeaderSize + paddedSize;
  }
  return {std::move(contents), {}};
}

ParseResult<FatbinContents> followWrapper(std::span<const std::byte> image) {
  if (image.size() < kWrapperBytes) {
    return ParseResult<FatbinContents>::failure(
        "fatbin wrapper truncated: " + std::to_string(image.size()) + " of " +
        std::to_string(kWrapperBytes) + " bytes");
  }
  const auto version = load<std::uint32_t>(image, 4);
  const auto address = load<std::uint64_t>(image, 8);
  if (version != 1 && version != 2) {
    return ParseResult<FatbinContents>::failure("fatbin wrapper version " +
                                                std::to_string(version) + " is not 1 or 2");
  }
  if (address == 0) return ParseResult<FatbinContents>::failure("fatbin wrapper points nowhere");
  // The caller vouched that the wrapper is this process's own, so its pointer is a real one.
  const auto* data = reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(address));
  const std::span<const std::byte> header(data, kFatbinHeaderBytes);
  if (load<std::uint32_t>(header, 0) != protocol::kFatbinMagic) {
    return ParseResult<FatbinContents>::failure(
        "fatbin wrapper points at bytes that are not a fatbin (magic " +
        hex(load<std::uint32_t>(header, 0)) + ")");
  }
  const std::uint64_t size = std::uint64_t{load<std::uint16_t>(header, 6)} +
                             std::min(load<std::uint64_t>(header, 8), kMaxFollowedFatbinBytes);
  if (size > kMaxFollowedFatbinBytes) {
    return ParseResult<FatbinContents>::failure("fatbin behind the wrapper claims " +
                                                std::to_string(size) + " bytes");
  }
  return parseFatbinData(std::span<const std::byte>(data, static_cast<std::size_t>(size)));
}

bool deviceCanRun(const FatbinEntry& entry, unsigned deviceArch) {
  switch (entry.variant) {
    case ArchVariant::kGeneric:
      return entry.arch <= deviceArch;
    case ArchVariant::kArchSpecific:
      return entry.arch == deviceArch;
    case ArchVariant::kFamilySpecific:
      return entry.arch <= deviceArch && entry.arch / 10 == deviceArch / 10;
  }
  return false;
}

// Whether `candidate` suits the device better than `best`, both runnable there.
bool betterPtx(const FatbinEntry& candidate, const FatbinEntry& best) {
  if (candidate.arch != best.arch) return candidate.arch > best.arch;
  // Generic PTX first: it uses no arch-only instructions, which are the ones an interpreter is
  // least likely to run.
  return candidate.variant == ArchVariant::kGeneric && best.variant != ArchVariant::kGeneric;
}

ParseResult<std::vector<std::byte>> decompressZstd(std::span<const std::byte> source,
                                                   std::uint64_t declared) {
  const unsigned long long frameSize = ZSTD_getFrameContentSize(source.data(), source.size());
  if (frameSize == ZSTD_CONTENTSIZE_ERROR) {
    return ParseResult<std::vector<std::byte>>::failure("payload is not a zstd frame");
  }
  if (frameSize != ZSTD_CONTENTSIZE_UNKNOWN && frameSize != declared) {
    return ParseResult<std::vector<std::byte>>::failure(
        "zstd frame holds " + std::to_string(frameSize) + " bytes but the entry declares " +
        std::to_string(declared));
  }
  // One byte more than declared, so that a frame holding more is caught as a size mismatch
  // rather than reported as a generic error; the buffer stays within the caller's bound + 1.
  std::vector<std::byte> output(static_cast<std::size_t>(declared) + 1);
  // One-shot decompression uses the output as its window, so a frame asking for a large window
  // costs no memory beyond this buffer.
  const std::size_t produced =
      ZSTD_decompress(output.data(), output.size(), source.data(), source.size());
  if (ZSTD_isError(produced)) {
    if (ZSTD_getErrorCode(produced) == ZSTD_error_dstSize_tooSmall) {
      return ParseResult<std::vector<std::byte>>::failure(
          "zstd payload decompresses to more than the declared " + std::to_string(declared) +
          " bytes");
    }
    return ParseResult<std::vector<std::byte>>::failure(std::string("zstd payload is corrupt: ") +
                                                        ZSTD_getErrorName(produced));
  }
  if (produced != declared) {
    return ParseResult<std::vector<std::byte>>::failure(
        "zstd payload decompresses to " +
        (produced > declared ? "more than" : std::to_string(produced) + " bytes, not") +
        " the declared " + std::to_string(declared) + " bytes");
  }
  output.resize(produced);
  return {std::move(output), {}};
}

ParseResult<std::vector<std::byte>> decompressLz4(std::span<const std::byte> source,
                                                  std::uint64_t declared) {
  // LZ4's interface counts in int; the spare byte below must fit too.
  if (source.size() > LZ4_MAX_INPUT_SIZE || declared >= INT_MAX) {
    return ParseResult<std::vector<std::byte>>::failure("LZ4 payload is too large");
  }
  // An LZ4 block expands at most about 255-fold (a match's length grows by 255 per byte), so a
  // declared size beyond that is a lie found without allocating for it.
  if (declared > 255 * std::uint64_t{source.size()} + 64) {
    return ParseResult<std::vector<std::byte>>::failure(
        "LZ4 payload of " + std::to_string(source.size()) + " bytes cannot decompress to the " +
        "declared " + std::to_string(declared) + " bytes");
  }
  std::vector<std::byte> output(static_cast<std::size_t>(declared) + 1);
  const int produced = LZ4_decompress_safe(
      reinterpret_cast<const char*>(source.data()), reinterpret_cast<char*>(output.data()),
      static_cast<int>(source.size()), static_cast<int>(output.size()));
  if (produced < 0) {
    // Output that would pass the buffer is reported the same way as corrupt input.
    return ParseResult<std::vector<std::byte>>::failure(
        "LZ4 payload is corrupt or decompresses to more than the declared " +
        std::to_string(declared) + " bytes");
  }
  if (static_cast<std::uint64_t>(produced) != declared) {
    return ParseResult<std::vector<std::byte>>::failure(
        "LZ4 payload decompresses to " +
        (static_cast<std::uint64_t>(produced) > declared
             ? "more than"
             : std::to_string(produced) + " bytes, not") +
        " the declared " + std::to_string(declared) + " bytes");
  }
  output.resize(static_cast<std::size_t>(produced));
  return {std::move(output), {}};
}

}  // namespace

std::string archName(const FatbinEntry& entry) {
  std::string name = "sm_" + std::to_string(entry.arch);
  if (entry.variant == ArchVariant::kArchSpecific) name += 'a';
  if (entry.variant == ArchVariant::kFamilySpecific) name += 'f';
  return name;
}

ParseResult<FatbinContents> parseFatbin(std::span<const std::byte> image, WrapperPolicy policy) {
  if (image.size() < sizeof(std::uint32_t)) {
    return ParseResult<FatbinContents>::failure("image of " + std::to_string(image.size()) +
                                                " bytes is too short for a fatbin");
  }
  const auto magic = load<std::uint32_t>(image, 0);
  if (magic == protocol::kFatbinWrapperMagic) {
    if (policy == WrapperPolicy::kFollowInThisProcess) return followWrapper(image);
    return ParseResult<FatbinContents>::failure(
        "image is a fatbin wrapper, whose pointer to the fatbin is no use outside the process "
        "that holds it; the fatbin itself is needed");
  }
  if (magic != protocol::kFatbinMagic) {
    return ParseResult<FatbinContents>::failure("not a fatbin (magic " + hex(magic) + ")");
  }
  return parseFatbinData(image);
}

ParseResult<std::vector<std::byte>> readEntryPayload(const FatbinContents& contents,
                                                     const FatbinEntry& entry,
                                                     std::size_t maxBytes) {
  using Result = ParseResult<std::vector<std::byte>>;
  // The entry may not have come from parseFatbin, so its range is checked again.
  if (entry.payloadOffset > contents.bytes.size() ||
      entry.payloadSize > contents.bytes.size() - entry.payloadOffset) {
    return Result::failure("entry payload lies outside the fatbin");
  }
  const std::span<const std::byte> payload = contents.bytes.subspan(
      static_cast<std::size_t>(entry.payloadOffset), static_cast<std::size_t>(entry.payloadSize));
  if (!entry.compressed) {
    if (payload.size() > maxBytes) {
      return Result::failure("entry holds " + std::to_string(payload.size()) +
                             " bytes, over the limit of " + std::to_string(maxBytes));
    }
    return {std::vector<std::byte>(payload.begin(), payload.end()), {}};
  }
  if (entry.kind == EntryKind::kOther) {
    return Result::failure("entry of kind " + std::to_string(entry.rawKind) +
                           " is compressed in a way this reader does not know");
  }
  if (entry.uncompressedSize > maxBytes) {
    return Result::failure("entry declares " + std::to_string(entry.uncompressedSize) +
                           " bytes uncompressed, over the limit of " + std::to_string(maxBytes));
  }
  if ((entry.flags & kFlagZstd) != 0 && (entry.flags & kFlagLz4) == 0) {
    return decompressZstd(payload, entry.uncompressedSize);
  }
  if ((entry.flags & kFlagLz4) != 0 && (entry.flags & kFlagZstd) == 0) {
    return decompressLz4(payload, entry.uncompressedSize);
  }
  return Result::failure("entry flags " + hex(entry.flags) + " name no single compression");
}

ParseResult<std::string> selectPtx(const FatbinContents& contents, unsigned deviceArch,
                                   std::size_t maxPtxBytes) {
  using Result = ParseResult<std::string>;
  const FatbinEntry* best = nullptr;
  for (const FatbinEntry& entry : contents.entries) {
    if (entry.kind != EntryKind::kPtx || !deviceCanRun(entry, deviceArch)) continue;
    if (best == nullptr || betterPtx(entry, *best)) best = &entry;
  }
  if (best == nullptr) {
    std::string message = "no PTX entry for sm_" + std::to_string(deviceArch) + "; the fatbin ";
    if (contents.entries.empty()) return Result::failure(message + "holds no entries");
    message += "holds: ";
    for (std::size_t i = 0; i < contents.entries.size(); ++i) {
      if (i != 0) message += ", ";
      message += describeHolding(contents.entries[i]);
    }
    return Result::failure(std::move(message));
  }

  ParseResult<std::vector<std::byte>> payload = readEntryPayload(contents, *best, maxPtxBytes);
  if (!payload.ok()) {
    return Result::failure("PTX entry for " + describeHolding(*best) + ": " + payload.error);
  }
  std::string_view text(reinterpret_cast<const char*>(payload.value->data()),
                        payload.value->size());
  // Uncompressed PTX is padded with NULs, and compressed PTX ends with its terminating NUL.
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);
  if (text.empty()) {
    return Result::failure("PTX entry for " + describeHolding(*best) + " is empty");
  }
  return {std::string(text), {}};
}

ParseResult<std::string> selectPtx(std::span<const std::byte> image, unsigned deviceArch,
                                   std::size_t maxPtxBytes) {
  ParseResult<FatbinContents> contents = parseFatbin(image, WrapperPolicy::kRefuse);
  if (!contents.ok()) return ParseResult<std::string>::failure(std::move(contents.error));
  return selectPtx(*contents.value, deviceArch, maxPtxBytes);
}

}  // namespace gpuproxy::server::fatbin
