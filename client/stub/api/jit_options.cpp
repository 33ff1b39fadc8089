#include "client/stub/api/jit_options.hpp"

#include "client/stub/enum_value.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace gpuproxy::stub {

namespace {

// The capacity the application gave a log buffer: the value of `sizeOption`, 0 without one. The
// options are read as integers: the application may put any value in them (enum_value.hpp).
std::uintptr_t bufferCapacity(unsigned numOptions, const CUjit_option* options,
                              void* const* optionValues, int sizeOption) {
  for (unsigned i = 0; i < numOptions; ++i) {
    if (enumValue(options[i]) == sizeOption) {
      return reinterpret_cast<std::uintptr_t>(optionValues[i]);
    }
  }
  return 0;
}

}  // namespace

void answerJitOutputOptions(unsigned numOptions, const CUjit_option* options, void** optionValues,
                            const JitLogs& logs) {
  // Bytes written into each log buffer, NUL included, for the size options below.
  std::uintptr_t infoWritten = 0;
  std::uintptr_t errorWritten = 0;
  for (unsigned i = 0; i < numOptions; ++i) {
    const int option = enumValue(options[i]);
    switch (option) {
      case CU_JIT_WALL_TIME:
        std::memcpy(&optionValues[i], &logs.wallMilliseconds, sizeof(logs.wallMilliseconds));
        break;
      case CU_JIT_INFO_LOG_BUFFER:
      case CU_JIT_ERROR_LOG_BUFFER: {
        const bool info = option == CU_JIT_INFO_LOG_BUFFER;
        const std::uintptr_t capacity = bufferCapacity(
            numOptions, options, optionValues,
            info ? CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES : CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
        auto* buffer = static_cast<char*>(optionValues[i]);
        if (buffer == nullptr || capacity == 0) break;
        const std::string_view text = info ? logs.info : logs.error;
        const std::size_t copied = std::min<std::size_t>(text.size(), capacity - 1);
        if (copied != 0) std::memcpy(buffer, text.data(), copied);  // an empty log may be null
        buffer[copied] = '\0';
        (info ? infoWritten : errorWritten) = text.empty() ? 0 : copied + 1;
        break;
      }
      default:
        break;
    }
  }
  // Sizes last: the loop above reads them as the buffers' capacities.
  for (unsigned i = 0; i < numOptions; ++i) {
    const int option = enumValue(options[i]);
    if (option == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES) {
      optionValues[i] = reinterpret_cast<void*>(infoWritten);
    } else if (option == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
      optionValues[i] = reinterpret_cast<void*>(errorWritten);
    }
  }
}

}  // namespace gpuproxy::stub
