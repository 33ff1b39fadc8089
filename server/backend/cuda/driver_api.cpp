#include "server/backend/cuda/driver_api.hpp"

#include <dlfcn.h>

#include <spdlog/spdlog.h>

#include <string>

// The entry-point table names typedefs that first appeared in these headers.
static_assert(CUDA_VERSION >= 12080, "the cuda backend needs CUDA 12.8 or newer headers");

namespace gpuproxy::server::cuda {
namespace {

// cuGetProcAddress_v2 itself arrived with CUDA 12.0; drivers older than that are not supported.
constexpr const char* kGetProcAddressSymbol = "cuGetProcAddress_v2";

// Looks `symbol` up at `version`. CUDA_ERROR_NOT_FOUND when the driver has no such entry point at
// that version (including a version newer than the driver: cuGetProcAddress says
// CUDA_ERROR_INVALID_VALUE then).
CUresult resolve(PFN_cuGetProcAddress_v12000 getProcAddress, const char* symbol, int version,
                 void** function) {
  *function = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult result =
      getProcAddress(symbol, function, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
  if (result == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *function != nullptr) {
    return CUDA_SUCCESS;
  }
  *function = nullptr;
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace

std::string DriverApi::describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (getErrorName == nullptr || getErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUDA error " + std::to_string(static_cast<int>(result));
  }
  std::string described = name;
  if (getErrorString != nullptr && getErrorString(result, &text) == CUDA_SUCCESS &&
      text != nullptr) {
    described += " (";
    described += text;
    described += ")";
  }
  return described;
}

std::string DriverApi::greenContextEntryPointsMissing() const {
  std::string missing;
  const auto need = [&](const void* entryPoint, const char* symbol) {
    if (entryPoint != nullptr) return;
    if (!missing.empty()) missing += ", ";
    missing += symbol;
  };
  need(reinterpret_cast<const void*>(libraryLoadData), "cuLibraryLoadData");
  need(reinterpret_cast<const void*>(libraryUnload), "cuLibraryUnload");
  need(reinterpret_cast<const void*>(libraryGetKernel), "cuLibraryGetKernel");
  need(reinterpret_cast<const void*>(kernelGetFunction), "cuKernelGetFunction");
  need(reinterpret_cast<const void*>(deviceGetDevResource), "cuDeviceGetDevResource");
  need(reinterpret_cast<const void*>(devSmResourceSplitByCount), "cuDevSmResourceSplitByCount");
  need(reinterpret_cast<const void*>(devResourceGenerateDesc), "cuDevResourceGenerateDesc");
  need(reinterpret_cast<const void*>(greenCtxCreate), "cuGreenCtxCreate");
  need(reinterpret_cast<const void*>(greenCtxDestroy), "cuGreenCtxDestroy");
  need(reinterpret_cast<const void*>(ctxFromGreenCtx), "cuCtxFromGreenCtx");
  need(reinterpret_cast<const void*>(greenCtxStreamCreate), "cuGreenCtxStreamCreate");
  return missing;
}

CUresult loadDriver(const std::string& library, std::shared_ptr<const DriverApi>& api,
                    std::string& whyNot) {
  dlerror();
  // RTLD_LOCAL: the driver's symbols must not satisfy anything else in the daemon.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    whyNot = "cannot load the CUDA driver " + library + ": " +
             (error != nullptr ? error : "unknown dlopen error");
    return CUDA_ERROR_NOT_INITIALIZED;
  }

  auto getProcAddress =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(handle, kGetProcAddressSymbol));
  if (getProcAddress == nullptr) {
    whyNot = library + " has no " + kGetProcAddressSymbol +
             ": not a CUDA driver, or one older than CUDA 12.0";
    // Nothing of it ran yet, so unloading it is safe.
    dlclose(handle);
    return CUDA_ERROR_NOT_SUPPORTED;
  }

  auto loaded = std::make_shared<DriverApi>();
  loaded->library = library;
  std::string missing;
#define GPUPROXY_CUDA_RESOLVE_REQUIRED(member, symbol, version)                               \
  if (resolve(getProcAddress, #symbol, version, reinterpret_cast<void**>(&loaded->member)) != \
      CUDA_SUCCESS) {                                                                         \
    missing += missing.empty() ? #symbol : ", " #symbol;                                      \
  }
  GPUPROXY_CUDA_REQUIRED_ENTRY_POINTS(GPUPROXY_CUDA_RESOLVE_REQUIRED)
#undef GPUPROXY_CUDA_RESOLVE_REQUIRED
#define GPUPROXY_CUDA_RESOLVE_OPTIONAL(member, symbol, version) \
  resolve(getProcAddress, #symbol, version, reinterpret_cast<void**>(&loaded->member));
  GPUPROXY_CUDA_OPTIONAL_ENTRY_POINTS(GPUPROXY_CUDA_RESOLVE_OPTIONAL)
#undef GPUPROXY_CUDA_RESOLVE_OPTIONAL
  if (resolve(getProcAddress, "cuEventElapsedTime", 12080,
              reinterpret_cast<void**>(&loaded->eventElapsedTime)) != CUDA_SUCCESS &&
      resolve(getProcAddress, "cuEventElapsedTime", 2000,
              reinterpret_cast<void**>(&loaded->eventElapsedTime)) != CUDA_SUCCESS) {
    missing += missing.empty() ? "cuEventElapsedTime" : ", cuEventElapsedTime";
  }
  if (!missing.empty()) {
    whyNot = library + " lacks driver entry points the daemon needs: " + missing;
    dlclose(handle);
    return CUDA_ERROR_NOT_FOUND;
  }

  // From here on the driver may have started threads: the library is never unloaded.
  const CUresult initialized = loaded->init(0);
  if (initialized != CUDA_SUCCESS) {
    whyNot = "cuInit failed: " + loaded->describe(initialized);
    return initialized;
  }
  const CUresult versioned = loaded->driverGetVersion(&loaded->driverVersion);
  if (versioned != CUDA_SUCCESS) {
    whyNot = "cuDriverGetVersion failed: " + loaded->describe(versioned);
    return versioned;
  }
  if (loaded->funcGetParamInfo == nullptr) {
    spdlog::warn(
        "cuda: driver {} has no cuFuncGetParamInfo (CUDA 12.4+); kernel parameter layouts come "
        "from the PTX parser and modules given as cubin or fatbin cannot be launched",
        loaded->driverVersion);
  }
  api = std::move(loaded);
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::server::cuda
