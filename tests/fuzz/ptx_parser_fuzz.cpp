// Fuzz target: PTX module images as clients send them to cuModuleLoadData.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "server/backend/ptx/ptx_parser.hpp"

namespace ptx = gpuproxy::server::ptx;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  (void)ptx::looksLikePtx(image);
  const ptx::PtxParseResult result = ptx::parsePtx(image);
  // The layout invariants every consumer relies on: parameters in order, aligned, inside the
  // declared total, which stays within the driver's limit.
  for (const ptx::PtxEntry& entry : result.module.entries) {
    std::uint64_t end = 0;
    for (const ptx::PtxParameter& parameter : entry.parameters) {
      if (parameter.alignment == 0 || parameter.offset % parameter.alignment != 0 ||
          parameter.offset < end) {
        std::abort();
      }
      end = std::uint64_t{parameter.offset} + parameter.size;
    }
    if (end != entry.parameterBytes || entry.parameterBytes > ptx::kMaxParameterBytes) std::abort();
  }
  if (!result.ok() && !result.module.entries.empty()) std::abort();
  return 0;
}
