// Modules, functions and kernel launches. Launch configurations are checked here, with the
// device limits from attach and the layout from cuModuleGetFunction, so that the errors a real
// launch reports synchronously stay synchronous (reference/remoting-tech.md §9.1).

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "client/stub/api/jit_options.hpp"
#include "client/stub/api/managed_memory.hpp"
#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/data_plane.hpp"
#include "client/stub/export.hpp"
#include "client/stub/launch_params.hpp"
#include "client/stub/module_image.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::describeModuleImage;
using gpuproxy::stub::DeviceRecord;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::KernelRecord;
using gpuproxy::stub::ModuleImage;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::ParameterSlot;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;
using gpuproxy::stub::toHandle;
using gpuproxy::stub::toResult;

namespace {

// An image up to one transfer chunk goes in one call; a larger one in pieces of a chunk each
// (beginModuleImage / appendModuleImage / loadModuleImage), through the data plane's staging
// region when there is one, so that no message is large and the daemon charges the image to the
// tenant before it holds any of it.
struct ModuleReply {
  CUresult result;
  std::uint64_t module;
};

ModuleReply loadModuleInPieces(Runtime& runtime, std::uint64_t context, const std::byte* image,
                               std::size_t size) {
  ModuleReply begun = runtime.call([&](Session::Client& session) {
    auto request = session.beginModuleImageRequest();
    request.setContext(context);
    request.setBytes(size);
    return request.send().then([](auto response) {
      return ModuleReply{toResult(response.getResult()), response.getUpload()};
    });
  });
  if (begun.result != CUDA_SUCCESS) return {begun.result, 0};
  const std::uint64_t upload = begun.module;  // the upload's id
  gpuproxy::stub::DataPlane* plane = runtime.dataPlane();
  const std::size_t chunk = static_cast<std::size_t>(
      plane != nullptr
          ? std::min<std::uint64_t>(plane->chunkBytes(), gpuproxy::protocol::MAX_TRANSFER_CHUNK)
          : gpuproxy::protocol::MAX_TRANSFER_CHUNK);
  for (std::size_t position = 0; position < size;) {
    const std::size_t length = std::min(chunk, size - position);
    std::optional<gpuproxy::stub::StagingAllocator::Range> range;
    if (plane != nullptr) {
      range = plane->allocateStaging(length, nullptr);
      if (!range) return {CUDA_ERROR_MPS_CONNECTION_FAILED, 0};
      std::memcpy(plane->staging().data() + range->offset, image + position, length);
    }
    const CUresult appended = runtime.call([&](Session::Client& session) {
      auto request = session.appendModuleImageRequest(
          capnp::MessageSize{(range ? 0 : length / sizeof(capnp::word)) + 64, 0});
      request.setUpload(upload);
      if (range) {
        request.setStagingOffset(range->offset);
        request.setStagingBytes(length);
      } else {
        request.setPiece(kj::arrayPtr(reinterpret_cast<const kj::byte*>(image + position), length));
      }
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    // The daemon has copied the piece out by the time it answers.
    if (range) plane->releaseStaging(*range);
    if (appended != CUDA_SUCCESS) return {appended, 0};
    position += length;
  }
  return runtime.call([&](Session::Client& session) {
    auto request = session.loadModuleImageRequest();
    request.setUpload(upload);
    return request.send().then([](auto response) {
      return ModuleReply{toResult(response.getResult()), response.getModule()};
    });
  });
}

}  // namespace

namespace gpuproxy::stub {

CUresult loadModuleInto(Runtime& runtime, std::uint64_t context, const void* image,
                        std::size_t size, std::uint64_t& module) {
  ModuleReply reply;
  if (size > gpuproxy::protocol::MAX_TRANSFER_CHUNK) {
    reply = loadModuleInPieces(runtime, context, static_cast<const std::byte*>(image), size);
  } else {
    reply = runtime.call([&](Session::Client& session) {
      auto request =
          session.loadModuleRequest(capnp::MessageSize{size / sizeof(capnp::word) + 64, 0});
      request.setContext(context);
      request.setImage(kj::arrayPtr(static_cast<const kj::byte*>(image), size));
      return request.send().then([](auto response) {
        return ModuleReply{toResult(response.getResult()), response.getModule()};
      });
    });
  }
  if (reply.result != CUDA_SUCCESS) return reply.result;
  runtime.addModule(reply.module, context);
  module = reply.module;
  return CUDA_SUCCESS;
}

CUresult lookUpFunction(Runtime& runtime, std::uint64_t module, const char* name,
                        std::uint64_t& function) {
  std::optional<std::uint64_t> context = runtime.moduleContext(module);
  if (module == 0 || !context) return CUDA_ERROR_INVALID_HANDLE;
  struct Reply {
    CUresult result;
    std::uint64_t function;
    std::shared_ptr<KernelRecord> record;
  };
  Reply reply = runtime.call([&](Session::Client& session) {
    auto request = session.getFunctionRequest();
    request.setModule(module);
    request.setName(name);
    return request.send().then([&](auto response) {
      Reply answer{toResult(response.getResult()), response.getFunction(), nullptr};
      if (answer.result != CUDA_SUCCESS) return answer;
      auto layout = response.getLayout();
      auto record = std::make_shared<KernelRecord>();
      record->name = name;
      record->module = module;
      record->context = *context;
      for (auto parameter : layout.getParameters()) {
        record->parameters.push_back(ParameterSlot{parameter.getOffset(), parameter.getSize()});
      }
      record->parameterBytes = layout.getParameterBytes();
      record->maxThreadsPerBlock = layout.getMaxThreadsPerBlock();
      record->sharedSizeBytes = layout.getSharedSizeBytes();
      record->numRegs = layout.getNumRegs();
      record->localSizeBytes = layout.getLocalSizeBytes();
      record->constSizeBytes = layout.getConstSizeBytes();
      record->ptxVersion = layout.getPtxVersion();
      record->binaryVersion = layout.getBinaryVersion();
      answer.record = std::move(record);
      return answer;
    });
  });
  if (reply.result != CUDA_SUCCESS) return reply.result;
  if (!gpuproxy::stub::layoutIsConsistent(reply.record->parameters, reply.record->parameterBytes)) {
    GPUPROXY_STUB_LOG(kError,
                      "cuModuleGetFunction(%s): gpuproxyd reported a parameter layout that "
                      "does not fit its own buffer",
                      name);
    return CUDA_ERROR_UNKNOWN;
  }
  // The daemon answers the same handle for the same kernel: a function looked up again keeps its
  // record, and with it what cuFuncSetAttribute set.
  if (!runtime.function(reply.function))
    runtime.addFunction(reply.function, std::move(reply.record));
  function = reply.function;
  return CUDA_SUCCESS;
}

CUresult placeManagedVariable(Runtime& runtime, std::uint64_t module, const char* name,
                              std::uint64_t address, bool keepValue) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.placeManagedVariableRequest();
    request.setModule(module);
    request.setName(name);
    request.setAddress(address);
    request.setKeepValue(keepValue);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
}

CUresult lookUpGlobal(Runtime& runtime, std::uint64_t module, const char* name,
                      std::uint64_t& pointer, std::uint64_t& bytes, bool* managed) {
  std::optional<std::uint64_t> context = runtime.moduleContext(module);
  if (module == 0 || !context) return CUDA_ERROR_INVALID_HANDLE;
  struct Reply {
    CUresult result;
    std::uint64_t pointer;
    std::uint64_t bytes;
    bool managed;
  };
  Reply reply = runtime.call([&](Session::Client& session) {
    auto request = session.getGlobalRequest();
    request.setModule(module);
    request.setName(name);
    return request.send().then([](auto response) {
      return Reply{toResult(response.getResult()), response.getPointer(), response.getBytes(),
                   response.getManaged()};
    });
  });
  if (reply.result != CUDA_SUCCESS) return reply.result;
  if (managed != nullptr) *managed = reply.managed;
  const std::optional<AllocationRange> holder = runtime.allocationContaining(reply.pointer);
  if (reply.managed && (!holder || !holder->managed)) {
    // A __managed__ variable the host must reach too: the first lookup gives it managed memory
    // of its own, to which gpuproxyd moves it; later lookups find it there.
    CUdeviceptr start = 0;
    if (CUresult allocated = allocateManaged(runtime, *context, reply.bytes, start);
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    const CUresult placed = placeManagedVariable(runtime, module, name, start, false);
    if (placed != CUDA_SUCCESS) {
      if (std::optional<AllocationRange> range = runtime.allocationContaining(start)) {
        freeManaged(runtime, *range);
      }
      GPUPROXY_STUB_LOG(kWarn, "the managed variable %s could not be given managed memory (%d)",
                        name, static_cast<int>(placed));
      return placed;
    }
    reply.pointer = start;
  } else if (!reply.managed) {
    runtime.addModuleVariable(reply.pointer, reply.bytes, *context, module);
  }
  pointer = reply.pointer;
  bytes = reply.bytes;
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::stub

namespace {

// Sends an image to the daemon as a module of the current context.
CUresult loadModule(Runtime& runtime, CUmodule* module, const void* image, std::size_t size) {
  const std::uint64_t context = currentContext();
  if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::uint64_t loaded = 0;
  if (CUresult result = gpuproxy::stub::loadModuleInto(runtime, context, image, size, loaded);
      result != CUDA_SUCCESS) {
    return result;
  }
  *module = toHandle<CUmodule>(loaded);
  return CUDA_SUCCESS;
}

CUresult loadModuleData(Runtime& runtime, CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::optional<ModuleImage> described = describeModuleImage(image);
  if (!described) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuModuleLoadData: the image has a cubin or fatbin header that "
                      "makes no sense");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  return loadModule(runtime, module, described->data, described->size);
}

// CUDA_SUCCESS when the configuration fits the device and the kernel.
CUresult checkLaunchConfiguration(const DeviceRecord* device, const KernelRecord& kernel,
                                  const unsigned grid[3], const unsigned block[3],
                                  unsigned sharedMemBytes) {
  for (int axis = 0; axis < 3; ++axis) {
    if (grid[axis] == 0 || block[axis] == 0) return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t threads = std::uint64_t{block[0]} * block[1] * block[2];
  if (kernel.maxThreadsPerBlock > 0 &&
      threads > static_cast<std::uint64_t>(kernel.maxThreadsPerBlock)) {
    // Said once per kernel: libraries that launch through their own copy of the runtime may
    // drop the error, and the block size was chosen for another build of the kernel.
    static std::mutex warnedMutex;
    static std::set<std::string> warned;
    std::lock_guard lock(warnedMutex);
    if (warned.insert(kernel.name).second) {
      GPUPROXY_STUB_LOG(kWarn,
                        "launch of %s refused: %llu threads per block, and the kernel was built "
                        "for at most %d (.maxntid or __launch_bounds__)",
                        kernel.name.c_str(), static_cast<unsigned long long>(threads),
                        kernel.maxThreadsPerBlock);
    }
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (device == nullptr) return CUDA_SUCCESS;
  auto exceeds = [&](CUdevice_attribute limit, std::uint64_t value) {
    std::optional<int> bound = device->attribute(limit);
    return bound && *bound > 0 && value > static_cast<std::uint64_t>(*bound);
  };
  static constexpr CUdevice_attribute kGridLimits[3] = {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
                                                        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
                                                        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z};
  static constexpr CUdevice_attribute kBlockLimits[3] = {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
                                                         CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
                                                         CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z};
  for (int axis = 0; axis < 3; ++axis) {
    if (exceeds(kGridLimits[axis], grid[axis]) || exceeds(kBlockLimits[axis], block[axis])) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (exceeds(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, threads)) return CUDA_ERROR_INVALID_VALUE;
  // A kernel gets the default per-block limit unless cuFuncSetAttribute raised its
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (up to the opt-in limit), as with the driver.
  const std::uint64_t shared = std::uint64_t{sharedMemBytes} +
                               static_cast<std::uint64_t>(std::max(kernel.sharedSizeBytes, 0));
  if (const int allowedDynamic = kernel.maxDynamicSharedSizeBytes.load(std::memory_order_relaxed);
      allowedDynamic >= 0) {
    if (sharedMemBytes > static_cast<unsigned>(allowedDynamic) ||
        exceeds(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, shared)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  } else if (exceeds(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, shared)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (kernel.numRegs > 0 && exceeds(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
                                    threads * static_cast<std::uint64_t>(kernel.numRegs))) {
    return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  }
  return CUDA_SUCCESS;
}

}  // namespace

namespace gpuproxy::stub {

// A thread's recent CUkernel launches: which function each became in which context. An entry is
// good while the runtime's tables have dropped nothing since it was made (Runtime::tablesEpoch:
// a module unloaded, a context destroyed or reset), so no stale function is ever launched.
struct LibraryKernelCache {
  struct Entry {
    std::uint64_t kernel = 0;
    std::uint64_t context = 0;
    std::uint64_t epoch = 0;
    std::uint64_t function = 0;
    std::shared_ptr<const KernelRecord> record;
  };
  static Entry& slot(std::uint64_t kernel) {
    thread_local std::array<Entry, 16> entries;
    // Kernel handles are addresses of heap objects: the bits above the allocation alignment.
    return entries[(kernel >> 4) % entries.size()];
  }
};

CUresult prepareLaunch(Runtime& runtime, CUfunction f, std::uint64_t context,
                       const unsigned grid[3], const unsigned block[3], unsigned sharedMemBytes,
                       void** kernelParams, void** extra, std::uint64_t& function,
                       std::vector<std::byte>& parameters) {
  function = handleValue(f);
  // The CUDA runtime launches every <<<>>> through a CUkernel: its function in the launch's
  // context is remembered per thread, so that the next launch finds it without a lookup.
  LibraryKernelCache::Entry& cached = LibraryKernelCache::slot(function);
  const std::uint64_t epoch = runtime.tablesEpoch();
  const bool knownKernel = cached.kernel == function && cached.epoch == epoch;
  std::shared_ptr<const KernelRecord> kernel;
  if (!knownKernel) kernel = runtime.function(function);
  const bool libraryKernel = knownKernel || (!kernel && gpuproxy::stub::isLibraryKernel(function));
  if (!kernel && !libraryKernel) return CUDA_ERROR_INVALID_HANDLE;
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A CUkernel runs as its function in the context it is launched in.
  if (libraryKernel) {
    if (knownKernel && cached.context == context) {
      function = cached.function;
      kernel = cached.record;
    } else {
      const std::uint64_t handle = function;
      if (CUresult resolved =
              gpuproxy::stub::libraryKernelFunction(runtime, handle, context, function);
          resolved != CUDA_SUCCESS) {
        return resolved;
      }
      kernel = runtime.function(function);
      if (!kernel) return CUDA_ERROR_INVALID_HANDLE;
      cached = LibraryKernelCache::Entry{handle, context, epoch, function, kernel};
    }
  }
  const DeviceRecord* device = nullptr;
  if (auto record = runtime.context(kernel->context)) {
    device = runtime.device(static_cast<CUdevice>(record->device));
  }
  if (CUresult checked = checkLaunchConfiguration(device, *kernel, grid, block, sharedMemBytes);
      checked != CUDA_SUCCESS) {
    return checked;
  }
  // A kernel runs in the context its module was loaded into (the daemon says the same).
  if (context != kernel->context) return CUDA_ERROR_INVALID_HANDLE;
  return gpuproxy::stub::packKernelParameters(kernel->parameters, kernel->parameterBytes,
                                              kernelParams, extra, parameters);
}

CUresult launchKernel(const char* entryPoint, CUfunction f, unsigned gridDimX, unsigned gridDimY,
                      unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
                      unsigned sharedMemBytes, CUstream hStream, void** kernelParams, void** extra,
                      NullStream nullStream, bool cooperative) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    // Reused by the thread's next launch: packing allocates nothing once it has grown.
    thread_local std::vector<std::byte> parameters;
    std::uint64_t function = 0;
    if (CUresult prepared = prepareLaunch(runtime, f, target.context, grid, block, sharedMemBytes,
                                          kernelParams, extra, function, parameters);
        prepared != CUDA_SUCCESS) {
      return prepared;
    }
    if (cooperative) {
      if (CUresult fits = cooperativeGridFits(runtime, function, block, sharedMemBytes,
                                              std::uint64_t{gridDimX} * gridDimY * gridDimZ);
          fits != CUDA_SUCCESS) {
        return fits;
      }
    }
    namespace ring = gpuproxy::protocol::ring;
    ring::Command command{ring::LaunchKernel{}};
    auto& launch = std::get<ring::LaunchKernel>(command);
    launch.context = target.context;
    launch.function = function;
    launch.stream = target.stream;
    launch.grid = ring::Dim3{gridDimX, gridDimY, gridDimZ};
    launch.block = ring::Dim3{blockDimX, blockDimY, blockDimZ};
    launch.sharedMemBytes = sharedMemBytes;
    launch.parameterBytes = static_cast<std::uint32_t>(parameters.size());
    launch.inlineParameters = parameters;
    launch.cooperative = cooperative;
    return runtime.commands().enqueue(command);
  });
}

}  // namespace gpuproxy::stub

using gpuproxy::stub::launchKernel;

GPUPROXY_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    std::ifstream file(fname, std::ios::binary);
    if (!file) return CUDA_ERROR_FILE_NOT_FOUND;
    std::vector<char> image((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    if (file.bad()) return CUDA_ERROR_FILE_NOT_FOUND;
    // A PTX file is text without the NUL that cuModuleLoadData's PTX images end with.
    const bool binary =
        gpuproxy::protocol::moduleImageKind(std::as_bytes(std::span<const char>(image))) !=
        gpuproxy::protocol::ModuleImageKind::kPtx;
    if (!binary && (image.empty() || image.back() != '\0')) image.push_back('\0');
    return loadModule(runtime, module, image.data(), image.size());
  });
}

GPUPROXY_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return guarded(__func__,
                 [&](Runtime& runtime) { return loadModuleData(runtime, module, image); });
}

// The same as cuModuleLoadData: the image kind is told from its first bytes either way.
GPUPROXY_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return guarded(__func__,
                 [&](Runtime& runtime) { return loadModuleData(runtime, module, fatCubin); });
}

GPUPROXY_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image,
                                            unsigned int numOptions, CUjit_option* options,
                                            void** optionValues) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (numOptions > 0) {
      gpuproxy::stub::answerJitOutputOptions(numOptions, options, optionValues);
    }
    return loadModuleData(runtime, module, image);
  });
}

GPUPROXY_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t function = 0;
    if (CUresult result =
            gpuproxy::stub::lookUpFunction(runtime, handleValue(hmod), name, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    *hfunc = toHandle<CUfunction>(function);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  return guarded(__func__, [&](Runtime& runtime) {
    const std::uint64_t module = handleValue(hmod);
    if (module == 0) return CUDA_ERROR_INVALID_HANDLE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.unloadModuleRequest();
      request.setModule(module);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) runtime.forgetModule(module);
    return result;
  });
}

GPUPROXY_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void** kernelParams, void** extra) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, extra, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                             unsigned int gridDimY, unsigned int gridDimZ,
                                             unsigned int blockDimX, unsigned int blockDimY,
                                             unsigned int blockDimZ, unsigned int sharedMemBytes,
                                             CUstream hStream, void** kernelParams, void** extra) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, extra, NullStream::kPerThread);
}

// A cooperative launch: every block resident at once, so that the grid may synchronise
// (cooperative_groups::this_grid().sync()); a grid the device cannot hold whole is refused.
GPUPROXY_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                   unsigned int gridDimY, unsigned int gridDimZ,
                                                   unsigned int blockDimX, unsigned int blockDimY,
                                                   unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void** kernelParams) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, nullptr, NullStream::kLegacy,
                      /*cooperative=*/true);
}

GPUPROXY_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
    unsigned int sharedMemBytes, CUstream hStream, void** kernelParams) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, nullptr, NullStream::kPerThread,
                      /*cooperative=*/true);
}

// As the driver decides it: CUDA_MODULE_LOADING=EAGER asks for eager loading, anything else (and
// nothing) is lazy, the default since CUDA 12.2. The stub itself always ships an image when it is
// loaded; the mode only tells the runtime which loading calls to make.
GPUPROXY_EXPORT CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* requested = std::getenv("CUDA_MODULE_LOADING");
  const bool eager = requested != nullptr && std::string_view(requested) == "EAGER";
  *mode = eager ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}

// Either output may be NULL, as with the driver.
GPUPROXY_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                              const char* name) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t pointer = 0;
    std::uint64_t size = 0;
    if (CUresult result =
            gpuproxy::stub::lookUpGlobal(runtime, handleValue(hmod), name, pointer, size);
        result != CUDA_SUCCESS) {
      return result;
    }
    if (dptr != nullptr) *dptr = pointer;
    if (bytes != nullptr) *bytes = static_cast<size_t>(size);
    return CUDA_SUCCESS;
  });
}
