// A CUDA program with its own Cap'n Proto, kj and C++ runtime (Debian's shared libraries), as an
// application that uses them itself would be: the stub's private copies must not replace them,
// nor the other way round. It uses kj (an event loop, a promise, an exception) before and after
// the stub is loaded and working, and throws and catches C++ exceptions of its own in between.
//   own_runtime_probe
// Prints "own_runtime_probe: OK" and the shared objects it has loaded.
#include <capnp/message.h>
#include <cuda.h>
#include <dlfcn.h>
#include <kj/async.h>
#include <kj/debug.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/programs/cuda_program.hpp"

namespace {

constexpr const char* kName = "own_runtime_probe";

// kj's event loop, a promise and an exception, through the program's own libkj.
int useKj(int value) {
  kj::EventLoop loop;
  kj::WaitScope waitScope(loop);
  int result = kj::evalLater([value] { return value * 2; }).wait(waitScope);
  KJ_IF_MAYBE (exception, kj::runCatchingExceptions([] { KJ_FAIL_REQUIRE("expected", 42); })) {
    if (exception->getDescription().findFirst('4') == nullptr) return -1;
  } else {
    return -1;
  }
  capnp::MallocMessageBuilder message;
  message.initRoot<capnp::AnyPointer>();
  if (message.getSegmentsForOutput().size() != 1) return -1;
  return result;
}

int countLoaded(dl_phdr_info* info, size_t, void* data) {
  auto* names = static_cast<std::vector<std::string>*>(data);
  if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') names->push_back(info->dlpi_name);
  return 0;
}

}  // namespace

int main() {
  if (useKj(21) != 42) {
    std::fprintf(stderr, "%s: kj before cuInit\n", kName);
    return 1;
  }
  CUDA_PROGRAM_CHECK(kName, cuInit(0));
  CUdevice device;
  CUcontext context;
  CUdeviceptr buffer;
  CUDA_PROGRAM_CHECK(kName, cuDeviceGet(&device, 0));
  CUDA_PROGRAM_CHECK(kName, cuDevicePrimaryCtxRetain(&context, device));
  CUDA_PROGRAM_CHECK(kName, cuCtxSetCurrent(context));
  CUDA_PROGRAM_CHECK(kName, cuMemAlloc(&buffer, 1 << 20));
  CUDA_PROGRAM_CHECK(kName, cuMemsetD8(buffer, 7, 1 << 20));
  unsigned char byte = 0;
  CUDA_PROGRAM_CHECK(kName, cuMemcpyDtoH(&byte, buffer + 1000, 1));
  try {
    throw std::runtime_error("the program's own exception");
  } catch (const std::runtime_error& error) {
    if (std::strcmp(error.what(), "the program's own exception") != 0) return 1;
  }
  if (useKj(50) != 100) {
    std::fprintf(stderr, "%s: kj after the stub\n", kName);
    return 1;
  }
  CUDA_PROGRAM_CHECK(kName, cuMemFree(buffer));
  CUDA_PROGRAM_CHECK(kName, cuDevicePrimaryCtxRelease(device));
  if (byte != 7) {
    std::fprintf(stderr, "%s: read %d, not 7\n", kName, byte);
    return 1;
  }
  std::vector<std::string> loaded;
  dl_iterate_phdr(countLoaded, &loaded);
  for (const std::string& name : loaded) std::printf("loaded %s\n", name.c_str());
  std::printf("%s: OK\n", kName);
  return 0;
}
