#pragma once
// The seam between the module entry points (module_launch.cpp) and the context-independent
// libraries and kernels built on them (library.cpp).

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "client/stub/api_support.hpp"
#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

// Ships `image` (already described: its exact bytes) to the daemon as a module of `context`.
CUresult loadModuleInto(Runtime& runtime, std::uint64_t context, const void* image,
                        std::size_t size, std::uint64_t& module);

// cuModuleGetFunction's work: asks the daemon and records the kernel's parameter layout.
CUresult lookUpFunction(Runtime& runtime, std::uint64_t module, const char* name,
                        std::uint64_t& function);

// cuModuleGetGlobal's work: where a module variable lies; its range becomes copyable. A
// __managed__ variable (`managed`, when asked) is given managed memory first, so that the host
// reaches it at the address returned.
CUresult lookUpGlobal(Runtime& runtime, std::uint64_t module, const char* name,
                      std::uint64_t& pointer, std::uint64_t& bytes, bool* managed = nullptr);

// Has gpuproxyd move managed variable `name` of `module` to `address` (managed memory of this
// process), with its value unless `keepValue` (the memory holds it: the same library's variable
// in another context lives there).
CUresult placeManagedVariable(Runtime& runtime, std::uint64_t module, const char* name,
                              std::uint64_t address, bool keepValue);

// Whether `handle` is a CUkernel from cuLibraryGetKernel that is still loaded.
bool isLibraryKernel(std::uint64_t handle);

// The CUfunction of CUkernel `kernel` in `context`: its library's module is loaded into the
// context on first use (lazy loading, as the driver does it) and the function looked up once.
CUresult libraryKernelFunction(Runtime& runtime, std::uint64_t kernel, std::uint64_t context,
                               std::uint64_t& function);

// The CUkernel whose function (in whichever context) `function` is; nullopt for a function
// cuModuleGetFunction gave.
std::optional<std::uint64_t> libraryKernelOf(std::uint64_t function);

// What a launch of `f` (a CUfunction or a CUkernel) in `context` sends, whatever stream it goes
// to: the configuration checked against the device and the kernel, the function (a CUkernel's in
// `context`) and the parameters packed with its layout.
CUresult prepareLaunch(Runtime& runtime, CUfunction f, std::uint64_t context,
                       const unsigned grid[3], const unsigned block[3], unsigned sharedMemBytes,
                       void** kernelParams, void** extra, std::uint64_t& function,
                       std::vector<std::byte>& parameters);
// cuLaunchKernel's work (also cuLaunchKernelEx's): checks the configuration against the device
// and the kernel (a CUfunction or a CUkernel), packs the parameters and queues the launch.
// `cooperative`: cuLaunchCooperativeKernel's launch, whose whole grid must fit on the device at
// once (cooperativeGridFits).
CUresult launchKernel(const char* entryPoint, CUfunction f, unsigned gridDimX, unsigned gridDimY,
                      unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
                      unsigned sharedMemBytes, CUstream hStream, void** kernelParams, void** extra,
                      NullStream nullStream, bool cooperative = false);
// Whether launch attribute `id` (a CUlaunchAttributeID) is a hint a kernel launch or kernel graph
// node may carry (priority, cache access policy, scheduling, carveout and memory synchronisation
// preferences): it changes nothing a kernel can observe, so every value is accepted
// (launch_ex.cpp).
bool isKernelLaunchHint(int id);
// Whether the device of `function` (a CUfunction) holds `blocks` blocks of this shape at once, as
// the occupancy calculator counts them: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE if not,
// CUDA_ERROR_NOT_SUPPORTED on a device without cooperative launches
// (function_attributes.cpp).
CUresult cooperativeGridFits(Runtime& runtime, std::uint64_t function, const unsigned block[3],
                             unsigned sharedMemBytes, std::uint64_t blocks);

}  // namespace gpuproxy::stub
