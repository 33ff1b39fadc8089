#pragma once
// Reads fatbins (what nvcc embeds in a program and what cuModuleLoadData/cuModuleLoadFatBinary
// accept): the list of entries, and the PTX text best suited to a device. The bytes come from
// clients, so every offset and size is checked against the image before it is used, decompression
// writes into a buffer no larger than a limit the caller sets, and anything malformed is reported
// as an error naming what is wrong rather than guessed at.
//
// The format is undocumented; what is read here was checked against nvcc 13.0's output
// (tests/data/fatbin/README.md). Numbers are little-endian.
//
//   fatbin header (16 bytes): u32 magic kFatbinMagic, u16 version 1, u16 header size,
//                             u64 bytes of entries that follow the header
//   entry header (>= 64 bytes; its payload follows it):
//      0 u16 kind            1 PTX, 2 ELF (cubin), others (8: LTO IR) are skipped
//      2 u16 version         0x0101
//      4 u32 header size     0x40 for ELF, 0x50 for PTX
//      8 u64 payload size    bytes after the header, padded
//     16 u32 compressed size the payload's meaningful bytes when compressed
//     24 u16 PTX minor, 26 u16 PTX major, 28 u32 arch (75 for sm_75/compute_75)
//     40 u64 flags           see kFlag* below
//     56 u64 uncompressed size, when compressed

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gpuproxy::server::fatbin {

// Entry flags nvcc 13 writes. 0x11 is set on every entry seen (64-bit, Linux host).
inline constexpr std::uint64_t kFlagLz4 = 0x2000;               // LZ4 block (--compress-mode=speed)
inline constexpr std::uint64_t kFlagZstd = 0x8000;              // zstd frame (nvcc 13's default)
inline constexpr std::uint64_t kFlagArchSpecific = 0x100000;    // sm_90a: that exact GPU only
inline constexpr std::uint64_t kFlagFamilySpecific = 0x200000;  // sm_100f: that family only

// What selectPtx decompresses at most unless the caller says otherwise.
inline constexpr std::size_t kDefaultMaxPtxBytes = std::size_t{64} << 20;

enum class EntryKind { kPtx, kElf, kOther };

// Which GPUs an entry is for, beyond its arch number.
enum class ArchVariant {
  kGeneric,         // sm_75: that arch and (for PTX) every later one
  kArchSpecific,    // sm_90a: exactly that arch
  kFamilySpecific,  // sm_100f: that arch and later ones with the same major version
};

struct FatbinEntry {
  EntryKind kind = EntryKind::kOther;
  std::uint16_t rawKind = 0;  // the kind field as written, for messages about kOther entries
  unsigned arch = 0;          // 75 for sm_75 / compute_75
  ArchVariant variant = ArchVariant::kGeneric;
  unsigned ptxMajor = 0;
  unsigned ptxMinor = 0;
  bool compressed = false;
  // Where the payload lies, counted from the start of the fatbin header (FatbinContents::bytes).
  // payloadSize is what the image holds for it: the compressed size when a PTX or ELF entry is
  // compressed, else the padded size (other kinds' compression is not known, so not checked).
  std::uint64_t payloadOffset = 0;
  std::uint64_t payloadSize = 0;
  std::uint64_t uncompressedSize = 0;  // as declared; equal to payloadSize when not compressed
  std::uint64_t flags = 0;
};

struct FatbinContents {
  // The fatbin's bytes from its header to its last entry: inside the image, or where a wrapper
  // pointed when the caller allowed following it. Entry offsets count from bytes.data().
  std::span<const std::byte> bytes;
  std::vector<FatbinEntry> entries;
  std::size_t size = 0;  // bytes the fatbin spans (bytes.size()); the image may go on after it
};

// A value, or why there is none. `error` is one line for a log, naming what is wrong.
template <typename T>
struct ParseResult {
  std::optional<T> value;
  std::string error;

  bool ok() const { return value.has_value(); }
  static ParseResult failure(std::string message) { return {std::nullopt, std::move(message)}; }
};

// Whether a __fatBinC_Wrapper_t's pointer to the fatbin data may be followed. It may only when
// the image lies in the caller's own address space and was put there by the program itself; an
// image from a client never does (the stub ships the fatbin data, not the wrapper), so there a
// wrapper is an error.
enum class WrapperPolicy { kRefuse, kFollowInThisProcess };

// Parses one fatbin starting at the first byte of `image`: a fatbin header or (policy allowing)
// a wrapper. Bytes after the fatbin are ignored. Payloads are located, not decompressed.
ParseResult<FatbinContents> parseFatbin(std::span<const std::byte> image,
                                        WrapperPolicy policy = WrapperPolicy::kRefuse);

// The payload of one entry of `contents`, decompressed when it is compressed. Fails when the
// declared uncompressed size is above maxBytes, when decompression fails, or when it produces
// other than the declared number of bytes (a compressed entry that lies about its size), and for
// compressed entries of kinds other than PTX and ELF.
ParseResult<std::vector<std::byte>> readEntryPayload(const FatbinContents& contents,
                                                     const FatbinEntry& entry,
                                                     std::size_t maxBytes);

// The PTX text (without the NUL padding the fatbin stores after it) of the entry best suited to
// a device of compute capability deviceArch (90 for 9.0): the PTX entry of the highest arch the
// device can run, a generic one before an arch- or family-specific one of the same arch, the
// first in the fatbin on a further tie. When there is none the error lists what the fatbin
// holds: "no PTX entry for sm_90; the fatbin holds: sm_75 (ELF), sm_80 (ELF)".
ParseResult<std::string> selectPtx(const FatbinContents& contents, unsigned deviceArch,
                                   std::size_t maxPtxBytes = kDefaultMaxPtxBytes);
// The same for an image from a client: parseFatbin (refusing wrappers), then selectPtx.
ParseResult<std::string> selectPtx(std::span<const std::byte> image, unsigned deviceArch,
                                   std::size_t maxPtxBytes = kDefaultMaxPtxBytes);

// "sm_75", "sm_90a", "sm_100f": how messages name an entry's arch.
std::string archName(const FatbinEntry& entry);

}  // namespace gpuproxy::server::fatbin
