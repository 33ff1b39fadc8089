#pragma once
// The JIT options' outputs (CU_JIT_WALL_TIME, the info and error log buffers and their sizes), as
// cuModuleLoadDataEx, cuLinkCreate and cuLinkAddData take them. The compilation itself happens in
// gpuproxyd, so what the stub has to say is its own: usually nothing, a refusal's reason
// otherwise. Every output option gets a defined value rather than whatever the application left
// in its buffers.

#include <cuda.h>

#include <string_view>

namespace gpuproxy::stub {

struct JitLogs {
  std::string_view info;
  std::string_view error;
  float wallMilliseconds = 0.0f;
};

// Writes `logs` where `options` ask for them: each log into its buffer, cut to the buffer's size
// (the matching *_LOG_BUFFER_SIZE_BYTES option) with its NUL, and that option's value replaced by
// the bytes written (NUL included; 0 for an empty log); the wall time into its option's value.
void answerJitOutputOptions(unsigned numOptions, const CUjit_option* options, void** optionValues,
                            const JitLogs& logs = {});

}  // namespace gpuproxy::stub
