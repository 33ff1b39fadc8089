#pragma once
// The PTX front end: reads a module as nvcc 12.x/13.x writes it (PTX ISA 7.x-9.x, sm_75..sm_90)
// and decodes it once into a Program (ptx_program.hpp) for the interpreter. The text comes from
// clients, so it is treated as hostile: no recursion on input structure, every count bounded,
// every reference resolved or refused.

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "server/backend/ptx/ptx_program.hpp"

namespace gpuproxy::server::ptx {

struct DecodeResult {
  std::unique_ptr<Program> program;  // null on failure
  // CUDA_ERROR_INVALID_PTX for text that is not valid PTX; CUDA_ERROR_NOT_SUPPORTED for valid PTX
  // none of whose kernels the interpreter can run (a kernel it cannot run in a module with one it
  // can is kept with the reason, Function::unsupported; the message names the first such
  // instruction and the
  // function holding it).
  CUresult status = CUDA_SUCCESS;
  std::string message;
  bool ok() const { return status == CUDA_SUCCESS; }
};

// Limits on what one module may declare; beyond them the module is refused as invalid.
inline constexpr std::size_t kMaxModuleBytes = 64u << 20;
inline constexpr std::uint32_t kMaxRegistersPerFunction = 1u << 16;
inline constexpr std::uint32_t kMaxInstructionsPerFunction = 1u << 22;
inline constexpr std::uint64_t kMaxVariableBytes = 1ull << 32;
inline constexpr std::uint64_t kMaxSharedBytes = 228u * 1024;
inline constexpr std::uint32_t kMaxLocalBytesPerFunction = 512u * 1024;

DecodeResult decodePtx(std::string_view text);

// Checks the invariants the interpreter relies on (rows, predicates, targets, call sites and
// offsets in range). Empty when the program is sound. decodePtx() runs it on what it makes.
std::string validateProgram(const Program& program);

}  // namespace gpuproxy::server::ptx
