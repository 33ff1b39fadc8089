// Libraries and kernels (cuLibrary*, cuKernel*): the context-independent loading that the CUDA
// runtime (12+) uses for every fatbin nvcc embeds. A CUlibrary keeps a copy of its image in the
// stub; the image becomes a module of a context the first time something of it is used there
// (lazy loading, as the driver does it by default), and a CUkernel becomes that module's function.
// CUlibrary and CUkernel handles are addresses of the stub's own objects, which never look like
// the daemon's handles (those carry their kind in the top byte).

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"
#include "client/stub/module_image.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toHandle;

namespace {

class Library;

// A kernel of a library, by name; its function per context is looked up once.
struct Kernel {
  Library* library = nullptr;
  std::string name;
};

// Where a context's copy of something lives, valid while the context keeps its generation (a
// destroyed or reset context forgets its modules; the next use loads the image again).
struct PerContext {
  std::uint64_t generation = 0;
  std::uint64_t handle = 0;
};

class Library {
public:
  explicit Library(std::vector<std::byte> image) : image_(std::move(image)) {}

  // The module of this library in `context`, loading it on first use there.
  CUresult moduleIn(Runtime& runtime, std::uint64_t context, std::uint64_t& module) {
    std::optional<gpuproxy::stub::ContextRecord> record = runtime.context(context);
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard lock(mutex_);
    auto found = modules_.find(context);
    if (found != modules_.end() && found->second.generation == record->generation &&
        runtime.moduleContext(found->second.handle)) {
      module = found->second.handle;
      return CUDA_SUCCESS;
    }
    std::uint64_t loaded = 0;
    if (CUresult result =
            gpuproxy::stub::loadModuleInto(runtime, context, image_.data(), image_.size(), loaded);
        result != CUDA_SUCCESS) {
      return result;
    }
    // Its managed variables live where the library's first module placed them: one variable for
    // the process and every device, as the driver has it.
    for (const auto& [name, address] : managedPlacements_) {
      if (CUresult placed =
              gpuproxy::stub::placeManagedVariable(runtime, loaded, name.c_str(), address, true);
          placed != CUDA_SUCCESS) {
        return placed;
      }
    }
    modules_[context] = PerContext{record->generation, loaded};
    module = loaded;
    return CUDA_SUCCESS;
  }

  // Where managed variable `name` lives for every context (the first placement wins).
  void notePlacement(const std::string& name, std::uint64_t address) {
    std::lock_guard lock(mutex_);
    managedPlacements_.emplace(name, address);
  }

  CUresult functionIn(Runtime& runtime, Kernel& kernel, std::uint64_t context,
                      std::uint64_t& function) {
    std::optional<gpuproxy::stub::ContextRecord> record = runtime.context(context);
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    {
      std::lock_guard lock(mutex_);
      auto found = functions_.find({&kernel, context});
      if (found != functions_.end() && found->second.generation == record->generation &&
          runtime.function(found->second.handle)) {
        function = found->second.handle;
        return CUDA_SUCCESS;
      }
    }
    std::uint64_t module = 0;
    if (CUresult result = moduleIn(runtime, context, module); result != CUDA_SUCCESS) {
      return result;
    }
    std::uint64_t looked = 0;
    if (CUresult result =
            gpuproxy::stub::lookUpFunction(runtime, module, kernel.name.c_str(), looked);
        result != CUDA_SUCCESS) {
      return result;
    }
    std::lock_guard lock(mutex_);
    functions_[{&kernel, context}] = PerContext{record->generation, looked};
    function = looked;
    return CUDA_SUCCESS;
  }

  // The kernel whose function in some context is `function`, if this library made it.
  Kernel* kernelOf(std::uint64_t function) {
    std::lock_guard lock(mutex_);
    for (const auto& [key, perContext] : functions_) {
      if (perContext.handle == function) return key.kernel;
    }
    return nullptr;
  }

  // The library's kernel named `name`, made on first request; the same handle afterwards.
  Kernel* kernel(const std::string& name) {
    std::lock_guard lock(mutex_);
    std::unique_ptr<Kernel>& slot = kernels_[name];
    if (!slot) slot = std::make_unique<Kernel>(Kernel{this, name});
    return slot.get();
  }

  std::vector<Kernel*> kernels() {
    std::lock_guard lock(mutex_);
    std::vector<Kernel*> all;
    for (auto& [name, kernel] : kernels_) all.push_back(kernel.get());
    return all;
  }

  // Unloads the library's modules from every context that still has them.
  void unloadModules(Runtime& runtime) {
    std::vector<std::uint64_t> loaded;
    {
      std::lock_guard lock(mutex_);
      for (auto& [context, module] : modules_) {
        if (runtime.moduleContext(module.handle)) loaded.push_back(module.handle);
      }
      modules_.clear();
      functions_.clear();
    }
    for (std::uint64_t module : loaded) cuModuleUnload(toHandle<CUmodule>(module));
  }

private:
  struct KernelInContext {
    Kernel* kernel;
    std::uint64_t context;
    bool operator==(const KernelInContext&) const = default;
  };
  struct KernelInContextHash {
    std::size_t operator()(const KernelInContext& key) const noexcept {
      return std::hash<const void*>()(key.kernel) ^ (std::hash<std::uint64_t>()(key.context) << 1);
    }
  };

  const std::vector<std::byte> image_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, PerContext> modules_;  // by context
  std::unordered_map<KernelInContext, PerContext, KernelInContextHash> functions_;
  std::unordered_map<std::string, std::unique_ptr<Kernel>> kernels_;
  std::map<std::string, std::uint64_t> managedPlacements_;  // managed variable -> its memory
};

// Every loaded library and its kernels, so that a handle is checked before it is followed.
class Libraries {
public:
  static Libraries& instance() {
    static auto* libraries = new Libraries();  // handles stay valid through static destruction
    return *libraries;
  }

  Library* add(std::unique_ptr<Library> library) {
    std::unique_lock lock(mutex_);
    Library* raw = library.get();
    libraries_.emplace(raw, std::move(library));
    return raw;
  }
  Library* find(std::uint64_t handle) const {
    std::shared_lock lock(mutex_);
    auto found = libraries_.find(reinterpret_cast<Library*>(static_cast<std::uintptr_t>(handle)));
    return found != libraries_.end() ? found->second.get() : nullptr;
  }
  Kernel* addKernel(Kernel* kernel) {
    std::unique_lock lock(mutex_);
    kernels_.emplace(kernel, kernel->library);
    return kernel;
  }
  Kernel* findKernel(std::uint64_t handle) const {
    std::shared_lock lock(mutex_);
    auto found = kernels_.find(reinterpret_cast<Kernel*>(static_cast<std::uintptr_t>(handle)));
    return found != kernels_.end() ? found->first : nullptr;
  }
  // The CUkernel whose function in some context is `function`, or null.
  Kernel* kernelOf(std::uint64_t function) const {
    std::shared_lock lock(mutex_);
    for (const auto& [library, owned] : libraries_) {
      if (Kernel* kernel = owned->kernelOf(function)) return kernel;
    }
    return nullptr;
  }
  std::unique_ptr<Library> remove(Library* library) {
    std::unique_lock lock(mutex_);
    auto found = libraries_.find(library);
    if (found == libraries_.end()) return nullptr;
    std::unique_ptr<Library> owned = std::move(found->second);
    libraries_.erase(found);
    std::erase_if(kernels_, [library](const auto& entry) { return entry.second == library; });
    return owned;
  }

private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<Library*, std::unique_ptr<Library>> libraries_;
  std::unordered_map<Kernel*, Library*> kernels_;
};

CUresult requireCurrentContext(std::uint64_t& context) {
  context = currentContext();
  return context != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult loadLibrary(const char* entryPoint, CUlibrary* library, const void* code) {
  return guarded(entryPoint, [&](Runtime&) {
    if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<gpuproxy::stub::ModuleImage> described =
        gpuproxy::stub::describeModuleImage(code);
    if (!described) {
      GPUPROXY_STUB_LOG(kWarn, "%s: the image has a cubin or fatbin header that makes no sense",
                        entryPoint);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    std::vector<std::byte> image(described->size);
    std::memcpy(image.data(), described->data, described->size);
    Library* loaded = Libraries::instance().add(std::make_unique<Library>(std::move(image)));
    *library = toHandle<CUlibrary>(reinterpret_cast<std::uintptr_t>(loaded));
    return CUDA_SUCCESS;
  });
}

}  // namespace

namespace gpuproxy::stub {

bool isLibraryKernel(std::uint64_t handle) {
  return Libraries::instance().findKernel(handle) != nullptr;
}

CUresult libraryKernelFunction(Runtime& runtime, std::uint64_t handle, std::uint64_t context,
                               std::uint64_t& function) {
  Kernel* kernel = Libraries::instance().findKernel(handle);
  if (kernel == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return kernel->library->functionIn(runtime, *kernel, context, function);
}

std::optional<std::uint64_t> libraryKernelOf(std::uint64_t function) {
  Kernel* kernel = Libraries::instance().kernelOf(function);
  if (kernel == nullptr) return std::nullopt;
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(kernel));
}

}  // namespace gpuproxy::stub

// JIT and library options tune the real driver's compiler and loader; the daemon's backend
// compiles, so they are accepted and have no effect here.
GPUPROXY_EXPORT CUresult cuLibraryLoadData(
    CUlibrary* library, const void* code, CUjit_option* /*jitOptions*/, void** /*jitOptionsValues*/,
    unsigned int /*numJitOptions*/, CUlibraryOption* /*libraryOptions*/,
    void** /*libraryOptionValues*/, unsigned int /*numLibraryOptions*/) {
  return loadLibrary(__func__, library, code);
}

GPUPROXY_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  return guarded(__func__, [&](Runtime& runtime) {
    Library* found = Libraries::instance().find(handleValue(library));
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    found->unloadModules(runtime);
    // The object goes with the handle; a CUkernel of it is refused from now on.
    Libraries::instance().remove(found);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  return guarded(__func__, [&](Runtime&) {
    if (kernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* found = Libraries::instance().find(handleValue(library));
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Kernel* named = Libraries::instance().addKernel(found->kernel(name));
    *kernel = toHandle<CUkernel>(reinterpret_cast<std::uintptr_t>(named));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuLibraryGetKernelCount(unsigned int* count, CUlibrary library) {
  return guarded(__func__, [&](Runtime&) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (Libraries::instance().find(handleValue(library)) == nullptr) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    // Counting needs the image's symbol table, which only the daemon reads.
    GPUPROXY_STUB_LOG(kWarn, "cuLibraryGetKernelCount is not supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

GPUPROXY_EXPORT CUresult cuLibraryGetModule(CUmodule* module, CUlibrary library) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* found = Libraries::instance().find(handleValue(library));
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    std::uint64_t context = 0;
    if (CUresult result = requireCurrentContext(context); result != CUDA_SUCCESS) return result;
    std::uint64_t loaded = 0;
    if (CUresult result = found->moduleIn(runtime, context, loaded); result != CUDA_SUCCESS) {
      return result;
    }
    *module = toHandle<CUmodule>(loaded);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuKernelGetFunction(CUfunction* function, CUkernel kernel) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!gpuproxy::stub::isLibraryKernel(handleValue(kernel))) return CUDA_ERROR_INVALID_HANDLE;
    std::uint64_t context = 0;
    if (CUresult result = requireCurrentContext(context); result != CUDA_SUCCESS) return result;
    std::uint64_t resolved = 0;
    if (CUresult result =
            gpuproxy::stub::libraryKernelFunction(runtime, handleValue(kernel), context, resolved);
        result != CUDA_SUCCESS) {
      return result;
    }
    *function = toHandle<CUfunction>(resolved);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuKernelGetLibrary(CUlibrary* library, CUkernel kernel) {
  return guarded(__func__, [&](Runtime&) {
    if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Kernel* found = Libraries::instance().findKernel(handleValue(kernel));
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *library = toHandle<CUlibrary>(reinterpret_cast<std::uintptr_t>(found->library));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuKernelGetName(const char** name, CUkernel kernel) {
  return guarded(__func__, [&](Runtime&) {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Kernel* found = Libraries::instance().findKernel(handleValue(kernel));
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *name = found->name.c_str();
    return CUDA_SUCCESS;
  });
}

namespace {

// A variable of `library` as the current context sees it: the library's module there is loaded
// first. `managedOnly`: cuLibraryGetManaged, which finds __managed__ variables only.
CUresult libraryVariable(Runtime& runtime, CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                         const char* name, bool managedOnly) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Library* found = Libraries::instance().find(handleValue(library));
  if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::uint64_t context = currentContext();
  if (context == 0 && managedOnly) {
    // The driver places a library's managed variables when it loads the library, for every
    // device, and cudart asks for them before any context is current. The stub places them
    // through device 0's primary context, which it retains for the rest of the process.
    CUcontext primary = nullptr;
    if (CUresult retained = cuDevicePrimaryCtxRetain(&primary, 0); retained != CUDA_SUCCESS) {
      return retained;
    }
    context = handleValue(primary);
  }
  if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::uint64_t module = 0;
  if (CUresult result = found->moduleIn(runtime, context, module); result != CUDA_SUCCESS) {
    return result;
  }
  std::uint64_t pointer = 0;
  std::uint64_t size = 0;
  bool managed = false;
  if (CUresult result =
          gpuproxy::stub::lookUpGlobal(runtime, module, name, pointer, size, &managed);
      result != CUDA_SUCCESS) {
    return result;
  }
  if (managedOnly && !managed) return CUDA_ERROR_NOT_FOUND;
  if (managed) found->notePlacement(name, pointer);
  if (dptr != nullptr) *dptr = pointer;
  if (bytes != nullptr) *bytes = static_cast<size_t>(size);
  return CUDA_SUCCESS;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                            const char* name) {
  return guarded(__func__, [&](Runtime& runtime) {
    return libraryVariable(runtime, dptr, bytes, library, name, false);
  });
}

// __managed__ variables: cudart asks for each when a context is first used and stores the
// address where the host code reaches the variable.
GPUPROXY_EXPORT CUresult cuLibraryGetManaged(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                             const char* name) {
  return guarded(__func__, [&](Runtime& runtime) {
    return libraryVariable(runtime, dptr, bytes, library, name, true);
  });
}
