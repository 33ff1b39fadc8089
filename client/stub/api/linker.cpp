// The JIT linker (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete, cuLinkDestroy), as
// NVIDIA's ptxjit sample, Numba and other JIT front ends use it: device code handed over piece by
// piece, the linked image given back, and that image loaded with cuModuleLoadData.
//
// gpuproxy compiles device code in gpuproxyd, when a module is loaded, and links nothing itself.
// So a link of one piece of code (PTX, a cubin or a fatbin) gives that piece back unchanged as its
// image, which cuModuleLoadData then compiles and checks as it would have the linker's cubin;
// linking several pieces together, and the inputs that only a linker can use (relocatable
// objects, libraries, LTO IR), are CUDA_ERROR_NOT_SUPPORTED, with the reason in the error log.

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/stub/api/jit_options.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "client/stub/live_handles.hpp"
#include "protocol/module_image.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::enumValue;
using gpuproxy::stub::guarded;
using gpuproxy::stub::JitLogs;
using gpuproxy::stub::LiveHandles;
using gpuproxy::stub::Runtime;

namespace {

// One pending link. Its output options are the application's arrays, which CUDA requires to stay
// valid for as long as the link state lives: they are answered again when the link completes or
// refuses an input. The log sizes are in-out values, so the capacities given at creation are kept
// to be given back before each answer.
struct LinkState {
  unsigned numOptions = 0;
  CUjit_option* options = nullptr;
  void** optionValues = nullptr;
  std::vector<void*> givenValues;  // optionValues as cuLinkCreate found them
  std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  std::vector<std::vector<char>> code;  // each input, as it came (PTX with its NUL)

  void answer(std::string_view error = {}) {
    for (unsigned i = 0; i < numOptions; ++i) {
      const int option = enumValue(options[i]);
      if (option == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
          option == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
        optionValues[i] = givenValues[i];
      }
    }
    const std::chrono::duration<float, std::milli> elapsed =
        std::chrono::steady_clock::now() - created;
    gpuproxy::stub::answerJitOutputOptions(numOptions, options, optionValues,
                                           JitLogs{{}, error, elapsed.count()});
  }
};

// Every link state handed out (live_handles.hpp).
LiveHandles<LinkState>& links() {
  static auto* table = new LiveHandles<LinkState>;
  return *table;
}

// Null unless `handle` is a live link state.
LinkState* linkOf(CUlinkState handle) {
  return links().find(handle);
}

// The refusal of an input kind that only a real device linker could use. Kinds are the integers
// the application passed (enum_value.hpp).
const char* inputNobodyLinks(int type) {
  switch (type) {
    case CU_JIT_INPUT_OBJECT:
      return "gpuproxy links no relocatable objects: load a fatbin or PTX of the whole program";
    case CU_JIT_INPUT_LIBRARY:
      return "gpuproxy links no device libraries: load a fatbin or PTX of the whole program";
    case CU_JIT_INPUT_NVVM:
      return "gpuproxy compiles no LTO IR: give it PTX";
    default:
      return nullptr;
  }
}

CUresult addCode(LinkState& state, int type, const char* data, std::size_t size,
                 unsigned numOptions, CUjit_option* options, void** optionValues) {
  if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (numOptions > 0) gpuproxy::stub::answerJitOutputOptions(numOptions, options, optionValues);
  if (const char* refusal = inputNobodyLinks(type)) {
    state.answer(refusal);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  using gpuproxy::protocol::ModuleImageKind;
  const ModuleImageKind kind =
      gpuproxy::protocol::moduleImageKind(std::as_bytes(std::span<const char>(data, size)));
  switch (type) {
    case CU_JIT_INPUT_PTX: {
      if (kind != ModuleImageKind::kPtx) {
        state.answer("the PTX input is a binary image");
        return CUDA_ERROR_INVALID_PTX;
      }
      // PTX is text: it ends at its NUL, or at `size` without one.
      const std::size_t length = strnlen(data, size);
      std::vector<char> text(data, data + length);
      text.push_back('\0');
      state.code.push_back(std::move(text));
      return CUDA_SUCCESS;
    }
    case CU_JIT_INPUT_CUBIN:
    case CU_JIT_INPUT_FATBINARY: {
      const bool wanted = type == CU_JIT_INPUT_CUBIN ? kind == ModuleImageKind::kElf
                                                     : kind == ModuleImageKind::kFatbin;
      if (!wanted) {
        state.answer(type == CU_JIT_INPUT_CUBIN ? "the cubin input is no ELF image"
                                                : "the fatbinary input is no fatbin");
        return CUDA_ERROR_INVALID_IMAGE;
      }
      state.code.emplace_back(data, data + size);
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult linkCreate(const char* entryPoint, unsigned numOptions, CUjit_option* options,
                    void** optionValues, CUlinkState* stateOut) {
  return guarded(entryPoint, [&](Runtime&) {
    if (stateOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The link is for the current context's device, as the driver's is.
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    auto state = std::make_unique<LinkState>();
    state->numOptions = numOptions;
    state->options = options;
    state->optionValues = optionValues;
    state->givenValues.assign(optionValues, optionValues + numOptions);
    state->answer();
    *stateOut = reinterpret_cast<CUlinkState>(links().adopt(std::move(state)));
    return CUDA_SUCCESS;
  });
}

CUresult linkAddData(const char* entryPoint, CUlinkState handle, int type, void* data, size_t size,
                     unsigned numOptions, CUjit_option* options, void** optionValues) {
  return guarded(entryPoint, [&](Runtime&) {
    LinkState* state = linkOf(handle);
    if (state == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (data == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    return addCode(*state, type, static_cast<const char*>(data), size, numOptions, options,
                   optionValues);
  });
}

CUresult linkAddFile(const char* entryPoint, CUlinkState handle, int type, const char* path,
                     unsigned numOptions, CUjit_option* options, void** optionValues) {
  return guarded(entryPoint, [&](Runtime&) {
    LinkState* state = linkOf(handle);
    if (state == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::ifstream file(path, std::ios::binary);
    if (!file) return CUDA_ERROR_FILE_NOT_FOUND;
    std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    if (file.bad()) return CUDA_ERROR_FILE_NOT_FOUND;
    if (bytes.empty()) return CUDA_ERROR_INVALID_VALUE;
    return addCode(*state, type, bytes.data(), bytes.size(), numOptions, options, optionValues);
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuLinkCreate(unsigned int numOptions, CUjit_option* options,
                                      void** optionValues, CUlinkState* stateOut) {
  return linkCreate(__func__, numOptions, options, optionValues, stateOut);
}

GPUPROXY_EXPORT CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options,
                                         void** optionValues, CUlinkState* stateOut) {
  return linkCreate(__func__, numOptions, options, optionValues, stateOut);
}

GPUPROXY_EXPORT CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void* data,
                                       size_t size, const char* /*name*/, unsigned int numOptions,
                                       CUjit_option* options, void** optionValues) {
  return linkAddData(__func__, state, enumValue(type), data, size, numOptions, options,
                     optionValues);
}

GPUPROXY_EXPORT CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data,
                                          size_t size, const char* /*name*/,
                                          unsigned int numOptions, CUjit_option* options,
                                          void** optionValues) {
  return linkAddData(__func__, state, enumValue(type), data, size, numOptions, options,
                     optionValues);
}

GPUPROXY_EXPORT CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char* path,
                                       unsigned int numOptions, CUjit_option* options,
                                       void** optionValues) {
  return linkAddFile(__func__, state, enumValue(type), path, numOptions, options, optionValues);
}

GPUPROXY_EXPORT CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path,
                                          unsigned int numOptions, CUjit_option* options,
                                          void** optionValues) {
  return linkAddFile(__func__, state, enumValue(type), path, numOptions, options, optionValues);
}

GPUPROXY_EXPORT CUresult cuLinkComplete(CUlinkState handle, void** imageOut, size_t* sizeOut) {
  return guarded(__func__, [&](Runtime&) {
    LinkState* state = linkOf(handle);
    if (state == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (imageOut == nullptr || sizeOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (state->code.empty()) {
      state->answer("nothing to link: no input was added");
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (state->code.size() > 1) {
      state->answer(
          "gpuproxy links no separate pieces of device code together: give it one PTX, cubin "
          "or fatbin of the whole program");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // The one piece is the image; the state owns it until cuLinkDestroy, as the driver's does.
    *imageOut = state->code.front().data();
    *sizeOut = state->code.front().size();
    state->answer();
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuLinkDestroy(CUlinkState handle) {
  return guarded(__func__, [&](Runtime&) {
    return links().destroy(handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}
