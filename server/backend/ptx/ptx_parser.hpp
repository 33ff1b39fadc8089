#pragma once
// Reads kernel (.entry) declarations and their parameter layouts from PTX text. The input comes
// from clients (cuModuleLoadData images), so the parser treats it as hostile: it never recurses,
// bounds every number it reads, and reports malformed text as an error instead of guessing.

#include "protocol/limits.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpuproxy::server::ptx {

struct PtxParameter {
  std::string name;
  std::uint32_t offset = 0;  // in the packed parameter buffer
  std::uint32_t size = 0;
  std::uint32_t alignment = 1;
};

struct PtxEntry {
  std::string name;
  std::vector<PtxParameter> parameters;
  std::uint32_t parameterBytes = 0;  // total size of the packed buffer, as cuLaunchKernel expects
};

struct PtxModuleInfo {
  std::vector<PtxEntry> entries;
};

struct PtxParseResult {
  PtxModuleInfo module;
  std::string error;  // empty on success
  bool ok() const { return error.empty(); }
};

// The most parameter space one kernel may declare (CUDA 12.1+ on Volta and later); the driver
// refuses larger kernels, so the parser does too.
inline constexpr std::uint32_t kMaxParameterBytes = protocol::kMaxKernelParameterBytes;

// Parses PTX text. Text after the first NUL byte is ignored (cuModuleLoadData reads PTX as a
// NUL-terminated string).
PtxParseResult parsePtx(std::string_view text);
PtxParseResult parsePtx(std::span<const std::byte> image);

// True when the image reads as PTX text: it contains both `.version` and `.target`.
bool looksLikePtx(std::span<const std::byte> image);

}  // namespace gpuproxy::server::ptx
