// A driver-API program for virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree): physical memory mapped where the
// program asks, used by kernels and copies like any device memory. Runs natively or through the
// stub; every scenario checks its own results and exits 1 with a message on stderr when one is
// wrong. Lines "<check> <CUresult name>" report what the driver answered to calls that must fail.
//
//   virtual_memory run            vector_add over three mapped ranges; one kernel writing across
//                                 two mappings of one reservation; one physical allocation mapped
//                                 at two addresses (a write through one is read through the
//                                 other); the queries; the calls CUDA refuses; everything given
//                                 back, and the device's free memory with it
//   virtual_memory hold BYTES     BYTES of physical memory mapped and written, "pointer 0x..."
//                                 printed, then wait to be killed
//   virtual_memory cross-device   (two devices) memory of device 1 mapped at addresses reserved
//                                 through device 0's context, and device 1 given access to
//                                 memory of device 0: through gpuproxy no two devices are peers
//   virtual_memory share N         physical memory made for a file descriptor, one granule per
//                                 child, each filled with a pattern and exported
//                                 (cuMemExportToShareableHandle); N children started with the
//                                 descriptors import all of it (cuMemImportFromShareableHandle),
//                                 map it at addresses of their own, check the pattern of theirs
//                                 and write their number into it; the parent reads what each
//                                 wrote through its own mapping. Also what CUDA refuses of it
//   virtual_memory share-child I N FD...
//                                 one such child (started by share)
//   virtual_memory outlive-context
//                                 addresses and memory made in a context of the program's own,
//                                 which it then destroys: as cuCtxDestroy leaves them, the
//                                 memory keeps its contents, physical memory is made with no
//                                 context current at all, and unmapping, releasing and freeing
//                                 the addresses afterwards succeed
#include <cuda.h>

#include "test_kernels_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kName = "virtual_memory";
#define CHECK(call) CUDA_PROGRAM_CHECK(kName, call)

void report(const char* check, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "UNKNOWN";
  std::printf("%s %s\n", check, name);
  std::fflush(stdout);
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  std::exit(1);
}

CUmemAllocationProp deviceMemory(CUdevice device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUresult grantReadWrite(CUdeviceptr address, std::size_t bytes, CUdevice device) {
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(address, bytes, &access, 1);
}

// `bytes` (a multiple of the granularity) of fresh physical memory mapped at a reservation of
// its own, read-write for `device`.
struct MappedRange {
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
};

MappedRange mapFresh(CUdevice device, std::size_t bytes) {
  MappedRange range;
  range.bytes = bytes;
  const CUmemAllocationProp prop = deviceMemory(device);
  CHECK(cuMemAddressReserve(&range.address, bytes, 0, 0, 0));
  CHECK(cuMemCreate(&range.handle, bytes, &prop, 0));
  CHECK(cuMemMap(range.address, bytes, 0, range.handle, 0));
  CHECK(grantReadWrite(range.address, bytes, device));
  return range;
}

void giveBack(const MappedRange& range) {
  CHECK(cuMemUnmap(range.address, range.bytes));
  CHECK(cuMemRelease(range.handle));
  CHECK(cuMemAddressFree(range.address, range.bytes));
}

std::size_t granularityOf(CUdevice device) {
  const CUmemAllocationProp prop = deviceMemory(device);
  std::size_t minimum = 0;
  std::size_t recommended = 0;
  CHECK(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (minimum == 0 || recommended % minimum != 0) die("granularities make no sense");
  return minimum;
}

void launchFill(CUfunction fill, CUdeviceptr target, unsigned value, unsigned long long count) {
  void* parameters[] = {&target, &value, &count};
  const unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  CHECK(cuLaunchKernel(fill, blocks, 1, 1, 256, 1, 1, 0, nullptr, parameters, nullptr));
}

void expectWords(const gpuproxy::programs::Program& program, CUdeviceptr source, std::size_t words,
                 unsigned value, const char* what) {
  const std::vector<unsigned> seen = program.download<unsigned>(source, words);
  for (std::size_t i = 0; i < words; ++i) {
    if (seen[i] != value) {
      die(std::string(what) + ": word " + std::to_string(i) + " is " + std::to_string(seen[i]) +
          ", not " + std::to_string(value));
    }
  }
}

void run(const gpuproxy::programs::Program& program) {
  const CUdevice device = program.device();
  const std::size_t granule = granularityOf(device);
  std::printf("granularity %zu\n", granule);
  const CUfunction vectorAdd = program.function("vector_add");
  const CUfunction fill = program.function("fill_u32");
  std::size_t freeBefore = 0;
  std::size_t total = 0;
  CHECK(cuMemGetInfo(&freeBefore, &total));

  // vector_add over three mapped ranges, as over three cuMemAlloc buffers.
  const int n = 300000;  // not a multiple of the granularity: the ranges are rounded up
  const std::size_t bytes = (n * sizeof(float) + granule - 1) / granule * granule;
  const MappedRange a = mapFresh(device, bytes);
  const MappedRange b = mapFresh(device, bytes);
  const MappedRange c = mapFresh(device, bytes);
  std::vector<float> hostA(n);
  std::vector<float> hostB(n);
  for (int i = 0; i < n; ++i) {
    hostA[i] = static_cast<float>(i % 1000) * 0.5f;
    hostB[i] = static_cast<float>(i % 77) - 3.0f;
  }
  CHECK(cuMemcpyHtoD(a.address, hostA.data(), n * sizeof(float)));
  CHECK(cuMemcpyHtoD(b.address, hostB.data(), n * sizeof(float)));
  int count = n;
  program.run(vectorAdd, (n + 255) / 256, 256,
              {const_cast<CUdeviceptr*>(&a.address), const_cast<CUdeviceptr*>(&b.address),
               const_cast<CUdeviceptr*>(&c.address), &count});
  const std::vector<float> sum = program.download<float>(c.address, n);
  for (int i = 0; i < n; ++i) {
    if (sum[i] != hostA[i] + hostB[i])
      die("vector_add over mapped memory: wrong at " + std::to_string(i));
  }
  std::printf("vector_add over mapped memory: %d sums right\n", n);

  // One reservation, two physical allocations behind it: a kernel sees one range.
  CUdeviceptr span = 0;
  CHECK(cuMemAddressReserve(&span, 3 * granule, 0, 0, 0));
  const CUmemAllocationProp prop = deviceMemory(device);
  CUmemGenericAllocationHandle front = 0;
  CUmemGenericAllocationHandle back = 0;
  CHECK(cuMemCreate(&front, 2 * granule, &prop, 0));
  CHECK(cuMemCreate(&back, granule, &prop, 0));
  CHECK(cuMemMap(span, 2 * granule, 0, front, 0));
  CHECK(cuMemMap(span + 2 * granule, granule, 0, back, 0));
  // Not reachable before its access is set.
  std::vector<unsigned> words(granule / sizeof(unsigned));
  report("cuMemcpyHtoD(before cuMemSetAccess)", cuMemcpyHtoD(span, words.data(), 64));
  CHECK(grantReadWrite(span, 3 * granule, device));
  launchFill(fill, span, 0x5eed, 3 * granule / sizeof(unsigned));
  expectWords(program, span, 2 * granule / sizeof(unsigned), 0x5eed, "the first mapping");
  expectWords(program, span + 2 * granule, granule / sizeof(unsigned), 0x5eed,
              "the second mapping");
  std::printf("a kernel wrote across two mappings\n");

  // The second allocation mapped once more, at a reservation of its own: the same memory.
  CUdeviceptr alias = 0;
  CHECK(cuMemAddressReserve(&alias, granule, 0, 0, 0));
  CHECK(cuMemMap(alias, granule, 0, back, 0));
  CHECK(grantReadWrite(alias, granule, device));
  CHECK(cuMemsetD32(alias, 0xa11a5, granule / sizeof(unsigned)));
  expectWords(program, span + 2 * granule, granule / sizeof(unsigned), 0xa11a5,
              "the aliased memory");
  expectWords(program, span, 2 * granule / sizeof(unsigned), 0x5eed, "the memory beside the alias");
  std::printf("one allocation at two addresses\n");

  // What the driver answers about them.
  unsigned long long flags = 0;
  CUmemLocation location = {};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device;
  CHECK(cuMemGetAccess(&flags, &location, span + granule));
  if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) die("cuMemGetAccess: not read-write");
  CUmemGenericAllocationHandle retained = 0;
  CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(alias + 64)));
  if (retained != back) die("cuMemRetainAllocationHandle: another handle");
  CHECK(cuMemRelease(retained));
  CUmemAllocationProp asked = {};
  CHECK(cuMemGetAllocationPropertiesFromHandle(&asked, front));
  if (asked.type != CU_MEM_ALLOCATION_TYPE_PINNED || asked.location.id != device) {
    die("cuMemGetAllocationPropertiesFromHandle: other properties");
  }

  // What CUDA refuses.
  CUdeviceptr spare = 0;
  CHECK(cuMemAddressReserve(&spare, 2 * granule, 0, 0, 0));
  report("cuMemMap(over a mapping)", cuMemMap(span, granule, 0, back, 0));
  const CUdeviceptr nowhere = 64 * granule;  // below every device's addresses, reserved by none
  report("cuMemMap(outside any reservation)", cuMemMap(nowhere, granule, 0, back, 0));
  report("cuMemMap(past the memory)", cuMemMap(spare, 2 * granule, 0, back, 0));
  report("cuMemMap(not granular)", cuMemMap(spare, granule / 2, 0, back, 0));
  report("cuMemSetAccess(part of a mapping)", grantReadWrite(span, granule, device));
  report("cuMemUnmap(part of a mapping)", cuMemUnmap(span, granule));
  report("cuMemAddressFree(still mapped)", cuMemAddressFree(span, 3 * granule));
  report("cuMemAddressFree(wrong size)", cuMemAddressFree(spare, granule));
  report("cuMemCreate(not granular)", cuMemCreate(&retained, granule + 4096, &prop, 0));
  CUmemAllocationProp fabric = prop;
  fabric.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  report("cuMemCreate(fabric handle)", cuMemCreate(&retained, granule, &fabric, 0));
  CUmemAllocationProp elsewhere = prop;
  elsewhere.location.id = 99;
  report("cuMemCreate(no such device)", cuMemCreate(&retained, granule, &elsewhere, 0));
  report("cuMemRelease(unknown)", cuMemRelease(0x1234));
  CHECK(cuMemAddressFree(spare, 2 * granule));

  // Released while mapped, the memory stays until it is unmapped.
  CHECK(cuMemRelease(back));
  expectWords(program, alias, granule / sizeof(unsigned), 0xa11a5, "released memory still mapped");
  CHECK(cuMemUnmap(alias, granule));
  report("cuMemcpyHtoD(unmapped)", cuMemcpyHtoD(alias, words.data(), 64));
  CHECK(cuMemAddressFree(alias, granule));
  // Both mappings of the reservation at once.
  CHECK(cuMemUnmap(span, 3 * granule));
  CHECK(cuMemRelease(front));
  report("cuMemRelease(twice)", cuMemRelease(front));
  CHECK(cuMemAddressFree(span, 3 * granule));
  giveBack(a);
  giveBack(b);
  giveBack(c);
  CHECK(cuCtxSynchronize());

  // Everything came back to the device: its free memory is what it was (the daemon frees
  // released memory before any later allocation, so one allocation waits for it).
  CUdeviceptr probe = 0;
  CHECK(cuMemAlloc(&probe, 4096));
  CHECK(cuMemFree(probe));
  std::size_t freeAfter = 0;
  CHECK(cuMemGetInfo(&freeAfter, &total));
  std::printf("free memory %s\n", freeAfter == freeBefore ? "restored" : "not restored");
  if (freeAfter != freeBefore) {
    die("free memory " + std::to_string(freeAfter) + " after, " + std::to_string(freeBefore) +
        " before");
  }
  std::printf("virtual_memory: PASSED\n");
}

void hold(const gpuproxy::programs::Program& program, std::size_t bytes) {
  const std::size_t granule = granularityOf(program.device());
  bytes = (bytes + granule - 1) / granule * granule;
  const MappedRange range = mapFresh(program.device(), bytes);
  launchFill(program.function("fill_u32"), range.address, 0xc0ffee, bytes / sizeof(unsigned));
  CHECK(cuCtxSynchronize());
  std::printf("pointer 0x%llx\n", static_cast<unsigned long long>(range.address));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(600));
}

void crossDevice(const gpuproxy::programs::Program& program) {
  int devices = 0;
  CHECK(cuDeviceGetCount(&devices));
  if (devices < 2) die("cross-device needs two devices");
  CUdevice other;
  CHECK(cuDeviceGet(&other, 1));
  CUcontext otherContext;
  CHECK(cuDevicePrimaryCtxRetain(&otherContext, other));
  const std::size_t granule = granularityOf(program.device());
  CUdeviceptr address = 0;
  CHECK(cuMemAddressReserve(&address, granule, 0, 0, 0));  // through device 0's context
  const CUmemAllocationProp prop = deviceMemory(other);
  CUmemGenericAllocationHandle handle = 0;
  CHECK(cuMemCreate(&handle, granule, &prop, 0));
  report("cuMemMap(memory of another device)", cuMemMap(address, granule, 0, handle, 0));
  const MappedRange own = mapFresh(program.device(), granule);
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = other;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  report("cuMemSetAccess(from another device)", cuMemSetAccess(own.address, granule, &access, 1));
  CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(address, granule));
  giveBack(own);
  CHECK(cuDevicePrimaryCtxRelease(other));
  std::printf("virtual_memory: PASSED\n");
}

// Made for export to a file descriptor.
CUmemAllocationProp shareableMemory(CUdevice device) {
  CUmemAllocationProp prop = deviceMemory(device);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

constexpr unsigned kSharedPattern = 0x5eed0000;

void share(const gpuproxy::programs::Program& program, int children) {
  const CUdevice device = program.device();
  int supported = 0;
  CHECK(cuDeviceGetAttribute(
      &supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device));
  if (supported != 1) die("the device says it cannot export to a file descriptor");
  const std::size_t granule = granularityOf(device);
  const std::size_t words = granule / sizeof(unsigned);
  const CUmemAllocationProp prop = shareableMemory(device);
  CUdeviceptr span = 0;
  CHECK(cuMemAddressReserve(&span, children * granule, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(children);
  std::vector<int> descriptors(children);
  for (int i = 0; i < children; ++i) {
    CHECK(cuMemCreate(&handles[i], granule, &prop, 0));
    CHECK(cuMemMap(span + i * granule, granule, 0, handles[i], 0));
    CHECK(cuMemExportToShareableHandle(&descriptors[i], handles[i],
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    // Passed on to the child by inheritance, as its number.
    if (::fcntl(descriptors[i], F_SETFD, 0) != 0) die("cannot pass the descriptor on");
  }
  CHECK(grantReadWrite(span, children * granule, device));
  for (int i = 0; i < children; ++i) {
    launchFill(program.function("fill_u32"), span + i * granule, kSharedPattern + i, words);
  }
  CHECK(cuCtxSynchronize());

  // What CUDA refuses.
  int refused = -1;
  report("cuMemExportToShareableHandle(fabric)",
         cuMemExportToShareableHandle(&refused, handles[0], CU_MEM_HANDLE_TYPE_FABRIC, 0));
  const CUmemAllocationProp plainProp = deviceMemory(device);
  CUmemGenericAllocationHandle plain = 0;
  CHECK(cuMemCreate(&plain, granule, &plainProp, 0));
  report(
      "cuMemExportToShareableHandle(not made for it)",
      cuMemExportToShareableHandle(&refused, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CHECK(cuMemRelease(plain));
  CUmemGenericAllocationHandle bogus = 0;
  const int notOurs = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  report("cuMemImportFromShareableHandle(another file)",
         cuMemImportFromShareableHandle(&bogus, reinterpret_cast<void*>(std::intptr_t{notOurs}),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(notOurs);

  std::vector<pid_t> started;
  for (int i = 0; i < children; ++i) {
    std::vector<std::string> arguments = {"virtual_memory", "share-child", std::to_string(i),
                                          std::to_string(children)};
    for (int fd : descriptors) arguments.push_back(std::to_string(fd));
    const pid_t child = ::fork();
    if (child < 0) die("fork failed");
    if (child == 0) {
      std::vector<char*> argv;
      for (std::string& argument : arguments) argv.push_back(argument.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    started.push_back(child);
  }
  for (pid_t child : started) {
    int status = 0;
    if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      die("a child failed");
    }
  }
  for (int fd : descriptors) ::close(fd);
  for (int i = 0; i < children; ++i) {
    expectWords(program, span + i * granule, words, static_cast<unsigned>(i + 1),
                "what a child wrote");
  }
  std::printf("shared with %d processes\n", children);
  CHECK(cuMemUnmap(span, children * granule));
  for (CUmemGenericAllocationHandle handle : handles) CHECK(cuMemRelease(handle));
  CHECK(cuMemAddressFree(span, children * granule));
  std::printf("virtual_memory: PASSED\n");
}

void shareChild(const gpuproxy::programs::Program& program, int index,
                const std::vector<int>& descriptors) {
  const CUdevice device = program.device();
  const std::size_t granule = granularityOf(device);
  const std::size_t words = granule / sizeof(unsigned);
  const std::size_t count = descriptors.size();
  CUdeviceptr span = 0;
  CHECK(cuMemAddressReserve(&span, count * granule, 0, 0, 0));
  for (std::size_t i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle handle = 0;
    CHECK(cuMemImportFromShareableHandle(&handle,
                                         reinterpret_cast<void*>(std::intptr_t{descriptors[i]}),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUmemAllocationProp prop = {};
    CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, handle));
    if (prop.location.id != device ||
        prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      die("an imported handle has other properties");
    }
    CHECK(cuMemMap(span + i * granule, granule, 0, handle, 0));
    CHECK(cuMemRelease(handle));  // the mapping keeps it
    ::close(descriptors[i]);
  }
  CHECK(grantReadWrite(span, count * granule, device));
  const CUdeviceptr mine = span + index * granule;
  expectWords(program, mine, words, kSharedPattern + index, "what the parent wrote");
  launchFill(program.function("fill_u32"), mine, static_cast<unsigned>(index + 1), words);
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(span, count * granule));
  CHECK(cuMemAddressFree(span, count * granule));
}

void outliveContext(const gpuproxy::programs::Program& program) {
  const CUdevice device = program.device();
  const std::size_t granule = granularityOf(device);
  const CUmemAllocationProp prop = deviceMemory(device);
  CUcontext own = nullptr;
  CHECK(cuCtxCreate(&own, nullptr, 0, device));
  CUdeviceptr span = 0;
  CHECK(cuMemAddressReserve(&span, 2 * granule, 0, 0, 0));
  CUmemGenericAllocationHandle first = 0;
  CHECK(cuMemCreate(&first, granule, &prop, 0));
  CHECK(cuMemMap(span, granule, 0, first, 0));
  CHECK(grantReadWrite(span, granule, device));
  CHECK(cuMemsetD32(span, 0xbeef, granule / sizeof(unsigned)));
  CHECK(cuCtxDestroy(own));  // the program's primary context is current again

  // No context current, and the primary one inactive: the memory is made on the device all the
  // same.
  CHECK(cuCtxSetCurrent(nullptr));
  CHECK(cuDevicePrimaryCtxRelease(device));
  unsigned flags = 0;
  int active = 1;
  CHECK(cuDevicePrimaryCtxGetState(device, &flags, &active));
  if (active != 0) die("the primary context is still active");
  CUmemGenericAllocationHandle second = 0;
  CHECK(cuMemCreate(&second, granule, &prop, 0));
  CHECK(cuMemMap(span + granule, granule, 0, second, 0));
  CHECK(grantReadWrite(span + granule, granule, device));
  CUcontext primary = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&primary, device));
  CHECK(cuCtxSetCurrent(primary));

  // What was written in the destroyed context is still there, and the rest is usable.
  expectWords(program, span, granule / sizeof(unsigned), 0xbeef, "memory outliving its context");
  CHECK(cuMemsetD32(span + granule, 0xfeed, granule / sizeof(unsigned)));
  expectWords(program, span + granule, granule / sizeof(unsigned), 0xfeed,
              "memory made with no context");
  std::printf("virtual memory outlived its context\n");
  CHECK(cuMemUnmap(span, 2 * granule));
  CHECK(cuMemRelease(first));
  CHECK(cuMemRelease(second));
  CHECK(cuMemAddressFree(span, 2 * granule));
  std::printf("virtual_memory: PASSED\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "run";
  const gpuproxy::programs::Program program(kName, gpuproxy::testing::kTestKernelsPtx);
  int supported = 0;
  CHECK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             program.device()));
  if (supported == 0) die("the device says it has no virtual memory management");
  if (scenario == "run") {
    run(program);
  } else if (scenario == "hold" && argc > 2) {
    hold(program, std::strtoull(argv[2], nullptr, 0));
  } else if (scenario == "cross-device") {
    crossDevice(program);
  } else if (scenario == "outlive-context") {
    outliveContext(program);
  } else if (scenario == "share" && argc > 2) {
    share(program, std::atoi(argv[2]));
  } else if (scenario == "share-child" && argc > 3) {
    std::vector<int> descriptors;
    for (int i = 4; i < argc; ++i) descriptors.push_back(std::atoi(argv[i]));
    shareChild(program, std::atoi(argv[2]), descriptors);
  } else {
    die("usage: virtual_memory run | hold BYTES | cross-device | outlive-context | share N");
  }
  return 0;
}
