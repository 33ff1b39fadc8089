// Fuzz target: fatbin images as clients send them to cuModuleLoadData/cuModuleLoadFatBinary,
// through the fatbin reader. Seeds: fatbins nvcc 13 wrote (uncompressed, zstd and LZ4 entries,
// several gencodes, SASS only, sm_90a, LTO IR; tests/data/fatbin/README.md).
// Properties: whatever the bytes, parsing and PTX selection end in a value or an error (never
// both, never neither) without crashing, hanging or leaking; what they report lies inside the
// image; and nothing decompressed exceeds the 1 MiB limit given, whatever an entry declares.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "server/backend/fatbin/fatbin_reader.hpp"

namespace fatbin = gpuproxy::server::fatbin;

namespace {

constexpr std::size_t kLimit = std::size_t{1} << 20;

void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  const fatbin::ParseResult<fatbin::FatbinContents> contents = fatbin::parseFatbin(image);
  require(contents.ok() != !contents.error.empty());
  if (contents.ok()) {
    const fatbin::FatbinContents& parsed = *contents.value;
    require(parsed.bytes.data() == image.data() && parsed.size == parsed.bytes.size());
    require(parsed.size <= image.size());
    for (const fatbin::FatbinEntry& entry : parsed.entries) {
      require(entry.payloadOffset <= parsed.size);
      require(entry.payloadSize <= parsed.size - entry.payloadOffset);
      const fatbin::ParseResult<std::vector<std::byte>> payload =
          fatbin::readEntryPayload(parsed, entry, kLimit);
      require(payload.ok() != !payload.error.empty());
      if (payload.ok()) {
        require(payload.value->size() <= kLimit);
        if (entry.compressed) require(payload.value->size() == entry.uncompressedSize);
      }
    }
  }
  for (const unsigned arch : {0u, 75u, 80u, 90u, 100u, 120u}) {
    const fatbin::ParseResult<std::string> ptx = fatbin::selectPtx(image, arch, kLimit);
    require(ptx.ok() != !ptx.error.empty());
    if (ptx.ok()) {
      require(contents.ok());
      require(!ptx.value->empty() && ptx.value->size() <= kLimit && ptx.value->back() != '\0');
    }
  }
  return 0;
}
