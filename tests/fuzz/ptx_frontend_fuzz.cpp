// Fuzz target: PTX module text as clients send it to cuModuleLoadData, through the sim's front
// end (decodePtx). Seeds: PTX nvcc wrote for the test programs (optimised, -G, sm_80 and sm_90).
// Properties: decoding never crashes, hangs or leaks whatever the bytes; a module it accepts
// passes validateProgram (every row, predicate, branch target, call site and offset in range),
// placing it in memory (Executable: constants, stack sizes, initialised variables with their
// relocations) stays inside what the program declares, and running each of its kernels (one small
// block, zeroed parameters, the module's variables as the only memory, stopped after a few
// milliseconds) ends in a result or a fault (CUDA_ERROR_NOT_SUPPORTED for a kernel the front end
// kept without code), never in a crash of the daemon.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "server/backend/ptx/ptx_frontend.hpp"
#include "server/backend/ptx/ptx_interpreter.hpp"

namespace ptx = gpuproxy::server::ptx;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ptx::DecodeResult result = ptx::decodePtx(text);
  if (!result.ok()) {
    if (result.program != nullptr || result.message.empty()) std::abort();
    if (result.status != CUDA_ERROR_INVALID_PTX && result.status != CUDA_ERROR_NOT_SUPPORTED) {
      std::abort();
    }
    return 0;
  }
  if (result.program == nullptr) std::abort();
  if (!ptx::validateProgram(*result.program).empty()) std::abort();
  const std::shared_ptr<const ptx::Program> program(std::move(result.program));
  const ptx::Executable executable(program, 1ull << 48);
  if (executable.initialImage().size() != program->globalBytes) std::abort();
  for (std::uint32_t f = 0; f < program->functions.size(); ++f) {
    const ptx::Function& function = program->functions[f];
    if (executable.constants(f).size() != function.constants.size()) std::abort();
    for (const std::uint32_t row : executable.localRows(f)) {
      if (row < function.registerRows || row >= function.rows()) std::abort();
    }
    if (function.isKernel && executable.localBytesPerThread(f) < function.localBytes) std::abort();
  }
  // Run every kernel briefly over the module's own variables.
  std::vector<std::byte> variables(std::max<std::uint64_t>(program->globalBytes, 1));
  const auto base = reinterpret_cast<std::uint64_t>(variables.data());
  const ptx::Executable placed(program, base);
  const std::vector<std::byte> image = placed.initialImage();
  std::copy(image.begin(), image.end(), variables.begin());
  const ptx::MemoryMap memory(placed.variableRanges(variables.data()));
  ptx::Interpreter interpreter(0);
  ptx::PrintfBuffer output(1 << 16);
  for (std::uint32_t f = 0; f < program->functions.size(); ++f) {
    const ptx::Function& function = program->functions[f];
    if (!function.isKernel || !function.defined) continue;
    std::vector<std::byte> parameters(function.kernelParameterBytes);
    std::atomic<bool> stop{false};
    ptx::LaunchRequest request;
    request.executable = &placed;
    request.kernel = f;
    request.block[0] = function.requiredThreads[0] != 0 ? function.requiredThreads[0] : 40;
    request.block[1] = function.requiredThreads[0] != 0 ? function.requiredThreads[1] : 1;
    request.block[2] = function.requiredThreads[0] != 0 ? function.requiredThreads[2] : 1;
    if (std::uint64_t{request.block[0]} * request.block[1] * request.block[2] > 1024) continue;
    request.grid[0] = 2;
    request.parameters = parameters;
    request.memory = &memory;
    request.stop = &stop;
    request.printf = &output;
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false;
    std::thread watchdog([&] {
      std::unique_lock lock(mutex);
      if (!finished.wait_for(lock, std::chrono::milliseconds(5), [&] { return done; })) {
        stop.store(true);
      }
    });
    const ptx::LaunchOutcome outcome = interpreter.run(request);
    {
      std::lock_guard lock(mutex);
      done = true;
    }
    finished.notify_all();
    watchdog.join();
    if (outcome.status != CUDA_SUCCESS && outcome.message.empty()) std::abort();
  }
  return 0;
}
