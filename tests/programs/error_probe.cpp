// A driver-API program that makes deliberate mistakes and prints what the driver answered, one
// line per check: "<check> <CUresult name>". Tests compare against what the real driver returns.
//
//   error_probe SCENARIO [ARG]
//
// Scenarios: init, bad-handle, copy-past-end, freed-memory, unknown-kernel, unsupported,
// unsupported-kernels, null-pointers, trap, foreign-pointer ADDRESS, alloc-and-hold BYTES, alloc
// BYTES, device-count, fork-hold BYTES, queue-and-hold BYTES KERNELS MICROSECONDS (allocates, then
// queues KERNELS spin kernels of MICROSECONDS each on the NULL stream without waiting for them, and
// holds), load-image FILE (cuModuleLoadData of the file's bytes; if that loads, runs its kernel
// `scale` over 256 floats and reports "scale-result OK" or "scale-result WRONG").
#include <cuda.h>

#include "test_kernels_ptx.hpp"
#include "unsupported_cluster_ptx.hpp"
#include "unsupported_surface_ptx.hpp"
#include "unsupported_tensor_cores_ptx.hpp"
#include "unsupported_texture_ptx.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include <unistd.h>
#include <vector>

namespace {

const char* nameOf(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) return "UNKNOWN";
  return name;
}

void report(const char* check, CUresult result) {
  std::printf("%s %s\n", check, nameOf(result));
  std::fflush(stdout);
}

// Everything but `init` starts from a current primary context on device 0.
bool setUp() {
  CUresult result = cuInit(0);
  if (result != CUDA_SUCCESS) {
    report("setup", result);
    return false;
  }
  CUdevice device;
  CUcontext context;
  if ((result = cuDeviceGet(&device, 0)) != CUDA_SUCCESS ||
      (result = cuDevicePrimaryCtxRetain(&context, device)) != CUDA_SUCCESS ||
      (result = cuCtxSetCurrent(context)) != CUDA_SUCCESS) {
    report("setup", result);
    return false;
  }
  return true;
}

// Well-formed PTX whose kernel samples a multi-sample texture: a GPU runs it, the sim's
// interpreter does not.
constexpr const char kTexturePtx[] = R"PTX(
.version 8.0
.target sm_75
.address_size 64

.visible .entry texture_kernel(
	.param .u64 texture_kernel_param_0
)
{
	.reg .f32 %f<5>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [texture_kernel_param_0];
	mov.b32 %r1, 0;
	tex.2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r1, %r1, %r1}];
	ret;
}
)PTX";

// Not PTX a compiler would write: a parameter list that never closes.
constexpr const char kMalformedPtx[] = R"PTX(
.version 8.0
.target sm_75
.address_size 64

.visible .entry broken(.param .u64 p
{
	ret;
}
)PTX";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: error_probe SCENARIO [ARG]\n");
    return 2;
  }
  std::string scenario = argv[1];

  if (scenario == "init") {
    report("cuInit", cuInit(0));
    CUdevice device;
    report("cuDeviceGet", cuDeviceGet(&device, 0));
    return 0;
  }
  if (!setUp()) return 1;

  if (scenario == "stream-properties") {
    // What cuCtxGetStreamPriorityRange and the cuStreamGet* queries answer, as "<check> <value>".
    int least = 1;
    int greatest = 1;
    report("cuCtxGetStreamPriorityRange", cuCtxGetStreamPriorityRange(&least, &greatest));
    std::printf("least %d\ngreatest %d\n", least, greatest);
    const std::pair<const char*, int> asked[] = {
        {"highest", -1000}, {"lowest", 1000}, {"default", 0}};
    for (const auto& [name, priority] : asked) {
      CUstream stream;
      report("cuStreamCreateWithPriority",
             cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, priority));
      int got = 99;
      unsigned flags = 99;
      CUcontext owner = nullptr;
      CUcontext current = nullptr;
      report("cuStreamGetPriority", cuStreamGetPriority(stream, &got));
      report("cuStreamGetFlags", cuStreamGetFlags(stream, &flags));
      report("cuStreamGetCtx", cuStreamGetCtx(stream, &owner));
      cuCtxGetCurrent(&current);
      std::printf("priority(%s) %d\nflags(%s) %u\nsame-context(%s) %d\n", name, got, name, flags,
                  name, owner == current ? 1 : 0);
    }
    int nullPriority = 99;
    unsigned nullFlags = 99;
    report("cuStreamGetPriority(NULL)", cuStreamGetPriority(nullptr, &nullPriority));
    report("cuStreamGetFlags(NULL)", cuStreamGetFlags(nullptr, &nullFlags));
    std::printf("priority(NULL) %d\nflags(NULL) %u\n", nullPriority, nullFlags);
    report("cuStreamGetPriority(bad stream)",
           cuStreamGetPriority(reinterpret_cast<CUstream>(0x9abc), &nullPriority));
    report("cuStreamGetPriority(no result)", cuStreamGetPriority(nullptr, nullptr));
    return 0;
  }
  if (scenario == "hang") {
    // A kernel that never ends, then a wait for it: the process stays until it is killed.
    CUmodule module;
    report("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
    CUfunction loop;
    report("cuModuleGetFunction", cuModuleGetFunction(&loop, module, "loop_forever"));
    CUdeviceptr flag;
    report("cuMemAlloc", cuMemAlloc(&flag, sizeof(int)));
    report("cuMemsetD32", cuMemsetD32(flag, 0, 1));
    void* arguments[] = {&flag};
    report("cuLaunchKernel",
           cuLaunchKernel(loop, 4, 1, 1, 64, 1, 1, 0, nullptr, arguments, nullptr));
    std::fflush(stdout);
    report("cuCtxSynchronize", cuCtxSynchronize());
    return 0;
  }
  if (scenario == "bad-handle") {
    report("cuStreamSynchronize", cuStreamSynchronize(reinterpret_cast<CUstream>(0xdeadbeef)));
    CUfunction function;
    report("cuModuleGetFunction",
           cuModuleGetFunction(&function, reinterpret_cast<CUmodule>(0x1234), "vector_add"));
    report("cuEventQuery", cuEventQuery(reinterpret_cast<CUevent>(0x5678)));
    report("cuStreamDestroy", cuStreamDestroy(reinterpret_cast<CUstream>(0x9abc)));
    CUevent event;
    report("cuEventCreate", cuEventCreate(&event, CU_EVENT_DEFAULT));
    // An event handle passed as a stream is still not a stream.
    report("cuStreamQuery(event)", cuStreamQuery(reinterpret_cast<CUstream>(event)));
  } else if (scenario == "copy-past-end") {
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, 1024));
    std::vector<char> host(4096, 7);
    report("cuMemcpyHtoD", cuMemcpyHtoD(pointer + 512, host.data(), 1024));
    report("cuMemcpyDtoH", cuMemcpyDtoH(host.data(), pointer, 2048));
    report("cuMemsetD32", cuMemsetD32(pointer, 0, 257));
    report("cuMemcpyHtoD(in bounds)", cuMemcpyHtoD(pointer, host.data(), 1024));
  } else if (scenario == "freed-memory") {
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, 4096));
    report("cuMemFree", cuMemFree(pointer));
    report("cuMemFree(again)", cuMemFree(pointer));
    char byte = 1;
    report("cuMemcpyHtoD(freed)", cuMemcpyHtoD(pointer, &byte, 1));
  } else if (scenario == "load-image" && argc > 2) {
    std::FILE* file = std::fopen(argv[2], "rb");
    if (file == nullptr) {
      std::printf("cannot open %s\n", argv[2]);
      return 1;
    }
    std::vector<char> image;
    char buffer[4096];
    for (std::size_t got; (got = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) {
      image.insert(image.end(), buffer, buffer + got);
    }
    std::fclose(file);
    image.resize(image.size() + 64, '\0');  // slack: a header may claim a little more than is here
    CUmodule module;
    const CUresult loaded = cuModuleLoadData(&module, image.data());
    report("cuModuleLoadData", loaded);
    if (loaded == CUDA_SUCCESS) {
      CUfunction scale;
      report("cuModuleGetFunction", cuModuleGetFunction(&scale, module, "scale"));
      int ptxVersion = 0;
      int binaryVersion = 0;
      cuFuncGetAttribute(&ptxVersion, CU_FUNC_ATTRIBUTE_PTX_VERSION, scale);
      cuFuncGetAttribute(&binaryVersion, CU_FUNC_ATTRIBUTE_BINARY_VERSION, scale);
      std::printf("scale-versions ptx %d binary %d\n", ptxVersion, binaryVersion);
      constexpr int kCount = 256;
      float host[kCount];
      for (int i = 0; i < kCount; ++i) host[i] = static_cast<float>(i);
      CUdeviceptr data;
      report("cuMemAlloc", cuMemAlloc(&data, sizeof(host)));
      report("cuMemcpyHtoD", cuMemcpyHtoD(data, host, sizeof(host)));
      float factor = 3.0f;
      int count = kCount;
      void* parameters[] = {&data, &factor, &count};
      report("cuLaunchKernel",
             cuLaunchKernel(scale, 1, 1, 1, kCount, 1, 1, 0, nullptr, parameters, nullptr));
      report("cuMemcpyDtoH", cuMemcpyDtoH(host, data, sizeof(host)));
      bool right = true;
      for (int i = 0; i < kCount; ++i) right = right && host[i] == 3.0f * static_cast<float>(i);
      std::printf("scale-result %s\n", right ? "OK" : "WRONG");
    }
  } else if (scenario == "unknown-kernel") {
    CUmodule module;
    report("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
    CUfunction function;
    report("cuModuleGetFunction", cuModuleGetFunction(&function, module, "no_such_kernel"));
    CUmodule other;
    report("cuModuleLoadData(texture)", cuModuleLoadData(&other, kTexturePtx));
    report("cuModuleLoadData(malformed)", cuModuleLoadData(&other, kMalformedPtx));
    const char garbage[] = "this is not a module";
    report("cuModuleLoadData(garbage)", cuModuleLoadData(&other, garbage));
  } else if (scenario == "unsupported-kernels") {
    // nvcc-built kernels using what the sim's interpreter does not run, one class per module.
    const std::pair<const char*, const char*> modules[] = {
        {"cuModuleLoadData(texture_sample)", gpuproxy::testing::kUnsupportedTexturePtx},
        {"cuModuleLoadData(surface_write)", gpuproxy::testing::kUnsupportedSurfacePtx},
        {"cuModuleLoadData(tensor_core_tile)", gpuproxy::testing::kUnsupportedTensorCoresPtx},
        {"cuModuleLoadData(cluster_exchange)", gpuproxy::testing::kUnsupportedClusterPtx},
    };
    for (const auto& [check, image] : modules) {
      CUmodule module;
      report(check, cuModuleLoadData(&module, image));
    }
    CUmodule module;
    report("cuModuleLoadData(supported)",
           cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  } else if (scenario == "unsupported") {
    // A wait for a value in memory on a stream (stream memory operations): not served.
    report("cuStreamWaitValue32", cuStreamWaitValue32(nullptr, 0, 1, CU_STREAM_WAIT_VALUE_GEQ));
    void* function = nullptr;
    CUdriverProcAddressQueryResult status;
    report("cuGetProcAddress", cuGetProcAddress("cuStreamWaitValue32", &function, CUDA_VERSION,
                                                CU_GET_PROC_ADDRESS_DEFAULT, &status));
    using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    if (function != nullptr) {
      report("cuStreamWaitValue32(proc address)",
             reinterpret_cast<WaitValue32>(function)(nullptr, 0, 1, CU_STREAM_WAIT_VALUE_GEQ));
    }
  } else if (scenario == "null-pointers") {
    report("cuMemAlloc(null)", cuMemAlloc(nullptr, 16));
    report("cuDeviceGetCount(null)", cuDeviceGetCount(nullptr));
    CUdeviceptr pointer;
    report("cuMemAlloc(0 bytes)", cuMemAlloc(&pointer, 0));
    CUdevice device;
    report("cuDeviceGet(99)", cuDeviceGet(&device, 99));
  } else if (scenario == "trap") {
    CUmodule module;
    CUfunction trap;
    report("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
    report("cuModuleGetFunction", cuModuleGetFunction(&trap, module, "trap"));
    report("cuLaunchKernel", cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    report("cuCtxSynchronize", cuCtxSynchronize());
    CUdeviceptr pointer;
    report("cuMemAlloc(after fault)", cuMemAlloc(&pointer, 16));
  } else if (scenario == "foreign-pointer" && argc > 2) {
    CUdeviceptr foreign = std::strtoull(argv[2], nullptr, 0);
    std::vector<char> host(64);
    report("cuMemcpyDtoH(foreign)", cuMemcpyDtoH(host.data(), foreign, host.size()));
    report("cuMemcpyHtoD(foreign)", cuMemcpyHtoD(foreign, host.data(), host.size()));
    report("cuMemsetD8(foreign)", cuMemsetD8(foreign, 0, host.size()));
    report("cuMemFree(foreign)", cuMemFree(foreign));
    // A kernel handed the pointer: on a GPU it would write there (one shared context); the sim
    // refuses it as an illegal address.
    CUmodule module;
    CUfunction fill;
    report("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
    report("cuModuleGetFunction", cuModuleGetFunction(&fill, module, "fill_u32"));
    unsigned value = 0xdeadbeef;
    unsigned long long count = 16;
    void* parameters[] = {&foreign, &value, &count};
    report("cuLaunchKernel(foreign)",
           cuLaunchKernel(fill, 1, 1, 1, 16, 1, 1, 0, nullptr, parameters, nullptr));
    report("cuCtxSynchronize(after foreign kernel)", cuCtxSynchronize());
  } else if (scenario == "alloc" && argc > 2) {
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, std::strtoull(argv[2], nullptr, 0)));
    std::size_t free = 0;
    std::size_t total = 0;
    report("cuMemGetInfo", cuMemGetInfo(&free, &total));
    std::printf("free %zu\ntotal %zu\n", free, total);
  } else if (scenario == "device-count") {
    int count = 0;
    report("cuDeviceGetCount", cuDeviceGetCount(&count));
    std::printf("count %d\n", count);
  } else if (scenario == "fork-hold" && argc > 2) {
    // The child inherits the connection to the daemon and outlives this process: the session
    // must still end when this process does.
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, std::strtoull(argv[2], nullptr, 0)));
    pid_t child = ::fork();
    if (child == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(600));
      ::_exit(0);
    }
    std::printf("child %d\n", static_cast<int>(child));
    std::fflush(stdout);
    ::_exit(0);
  } else if (scenario == "alloc-and-hold" && argc > 2) {
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, std::strtoull(argv[2], nullptr, 0)));
    std::vector<unsigned char> pattern(64, 0xab);
    report("cuMemcpyHtoD", cuMemcpyHtoD(pointer, pattern.data(), pattern.size()));
    std::printf("pointer 0x%llx\n", static_cast<unsigned long long>(pointer));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(600));
  } else if (scenario == "alloc-loop") {
    // Control calls back to back until one fails (the daemon went away): there is nearly always
    // one in flight.
    CUresult result = CUDA_SUCCESS;
    for (unsigned long i = 0; result == CUDA_SUCCESS; ++i) {
      CUdeviceptr pointer = 0;
      result = cuMemAlloc(&pointer, 4096);
      if (result == CUDA_SUCCESS) result = cuMemFree(pointer);
      if (i == 0) {
        std::printf("looping\n");
        std::fflush(stdout);
      }
    }
    report("cuMemAlloc/cuMemFree", result);
  } else if (scenario == "queue-and-hold" && argc > 4) {
    CUdeviceptr pointer;
    report("cuMemAlloc", cuMemAlloc(&pointer, std::strtoull(argv[2], nullptr, 0)));
    CUmodule module;
    CUfunction spin;
    report("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
    report("cuModuleGetFunction", cuModuleGetFunction(&spin, module, "spin"));
    const unsigned long kernels = std::strtoul(argv[3], nullptr, 0);
    unsigned long long ns = std::strtoull(argv[4], nullptr, 0) * 1000;
    void* params[] = {&ns};
    CUresult launched = CUDA_SUCCESS;
    for (unsigned long i = 0; i < kernels && launched == CUDA_SUCCESS; ++i) {
      launched = cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
    }
    report("cuLaunchKernel", launched);
    std::this_thread::sleep_for(std::chrono::seconds(600));
  } else {
    std::fprintf(stderr, "error_probe: unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  return 0;
}
