#pragma once
// Device printf (vprintf): a format string in device memory and an argument buffer laid out as
// nvcc lays it out (each argument at its own alignment; floats promoted to double), formatted as
// the CUDA runtime formats it on the host.

#include <cstdint>
#include <string>

#include "server/backend/ptx/ptx_exec.hpp"

namespace gpuproxy::server::ptx {

// CUDA's limit on the arguments of one printf call.
inline constexpr unsigned kMaxPrintfArguments = 32;
// Longest string a %s or a format may be; longer ones are cut (a GPU copies them whole).
inline constexpr std::size_t kMaxPrintfString = 64 * 1024;

struct PrintfResult {
  bool ok = false;    // false: a fault was recorded in the context
  int arguments = 0;  // what vprintf returns: the arguments it read, or -1 for a bad format
  std::string text;
};

// Formats lane `lane`'s call: `format` and `arguments` are generic addresses.
PrintfResult formatDevicePrintf(ExecContext& context, std::uint32_t lane, std::uint64_t format,
                                std::uint64_t arguments);

// Reads a NUL-terminated string at generic address `address` (at most kMaxPrintfString bytes).
bool readDeviceString(ExecContext& context, std::uint32_t lane, std::uint64_t address,
                      std::string& out);

}  // namespace gpuproxy::server::ptx
