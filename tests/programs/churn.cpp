// An ordinary driver-API program that keeps the GPU busy in a loop, for torture tests that kill it
// at random moments: it allocates buffers of random sizes (4 KiB .. 64 MiB), copies in, launches
// fill_u32 / vector_add / spin on the null stream or on extra streams, copies out and verifies,
// frees some buffers and keeps others (so that whenever it dies it holds memory, and perhaps
// work in flight). Big copies make it likely that a kill lands mid-copy.
//
//   churn [--seed S] [--seconds N] [--device D] [--streams K] [--hold-bytes B] [--max-bytes B]
//         [--phase-file PATH]
//
// Everything it does follows from --seed. --seconds 0 (default) loops until killed; otherwise it
// frees everything and exits 0 after N seconds. Any CUDA error or wrong result: a message on
// stderr and exit code 1. --phase-file names a file that always holds what the program is doing
// right now ("copy-htod", "launch", ...), written through a shared mapping so it costs no system
// call and survives SIGKILL: a harness reads it after the kill to know where the kill landed.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test_kernels_ptx.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kMinBytes = std::size_t{4} << 10;
constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
constexpr std::size_t kPhaseBytes = 64;
constexpr unsigned kBlock = 256;

struct Options {
  std::uint64_t seed = 1;
  double seconds = 0;
  int device = 0;
  int streams = 2;
  std::size_t holdBytes = std::size_t{128} << 20;
  std::size_t maxBytes = kMaxBytes;
  std::string phaseFile;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "churn: %s\n", message.c_str());
  std::exit(1);
}

[[noreturn]] void fail(const char* call, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  die(std::string(call) + " failed: " + name + " (" + std::to_string(static_cast<int>(result)) +
      ")");
}

#define CHECK(call)                                    \
  do {                                                 \
    CUresult result_ = (call);                         \
    if (result_ != CUDA_SUCCESS) fail(#call, result_); \
  } while (0)

// splitmix64: the same sequence for a seed on every compiler and standard library, which
// std::uniform_int_distribution does not promise.
class Rng {
public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t bound) { return next() % bound; }
  bool chance(unsigned percent) { return below(100) < percent; }

private:
  std::uint64_t state_;
};

// Where the program is, for whoever reads the phase file after killing it.
class PhaseMarker {
public:
  explicit PhaseMarker(const std::string& path) {
    if (path.empty()) return;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::ftruncate(fd, kPhaseBytes) != 0) die("cannot create phase file " + path);
    void* mapped = ::mmap(nullptr, kPhaseBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (mapped == MAP_FAILED) die("cannot map phase file " + path);
    text_ = static_cast<char*>(mapped);
  }
  void set(const char* phase) {
    std::size_t length = std::min(std::strlen(phase), kPhaseBytes - 1);
    std::memcpy(text_, phase, length);
    text_[length] = '\0';
  }

private:
  char fallback_[kPhaseBytes] = {};
  char* text_ = fallback_;
};

// What a kept buffer must still hold, so it can be checked again later: if reclaiming another
// client ever touched this one's memory, the check fails.
enum class Pattern { kFill, kSum };

struct Buffer {
  CUdeviceptr pointer = 0;
  std::size_t bytes = 0;
  Pattern pattern = Pattern::kFill;
  std::uint32_t value = 0;  // the fill value, or the vector_add offset
};

// Small integers, so float sums are exact.
float addendA(std::size_t i) {
  return static_cast<float>(i & 0xffff);
}
float addendB(std::size_t i, std::uint32_t offset) {
  return static_cast<float>((i * 7 + offset) & 0xff);
}

class Churn {
public:
  explicit Churn(const Options& options)
      : options_(options), rng_(options.seed), phase_(options.phaseFile) {}

  int run();

private:
  void setUp();
  void tearDown();
  std::size_t randomBytes();
  CUstream randomStream();
  CUdeviceptr allocate(std::size_t bytes);
  void maybeSpin();
  Buffer fillOnce();
  Buffer addOnce();
  void checkKept();
  void verify(const Buffer& buffer, CUstream stream, const char* what);
  void keepOrFree(const Buffer& buffer);
  void release(CUdeviceptr pointer);

  Options options_;
  Rng rng_;
  PhaseMarker phase_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction fill_ = nullptr;
  CUfunction add_ = nullptr;
  CUfunction spin_ = nullptr;
  std::vector<CUstream> streams_;  // [0] is the null stream
  std::vector<Buffer> kept_;
  std::size_t keptBytes_ = 0;
  // Host staging, reused: allocating and faulting in 64 MiB per operation would make the loop
  // mostly page faults rather than GPU traffic.
  std::unique_ptr<float[]> hostA_, hostB_, hostOut_;
  std::uint64_t iterations_ = 0;
  std::uint64_t bytesCopied_ = 0;
};

void Churn::setUp() {
  phase_.set("init");
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device_, options_.device));
  CHECK(cuDevicePrimaryCtxRetain(&context_, device_));
  CHECK(cuCtxSetCurrent(context_));
  phase_.set("module-load");
  CHECK(cuModuleLoadData(&module_, gpuproxy::testing::kTestKernelsPtx));
  CHECK(cuModuleGetFunction(&fill_, module_, "fill_u32"));
  CHECK(cuModuleGetFunction(&add_, module_, "vector_add"));
  CHECK(cuModuleGetFunction(&spin_, module_, "spin"));
  streams_.push_back(nullptr);
  for (int i = 0; i < options_.streams; ++i) {
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    streams_.push_back(stream);
  }
  // Left uninitialised: zeroing 3 x 64 MiB up front would keep a young client in start-up for
  // a long time on a loaded machine, and the loop writes before it reads anyway.
  phase_.set("host-buffers");
  std::size_t elements = options_.maxBytes / sizeof(float);
  hostA_.reset(new float[elements]);
  hostB_.reset(new float[elements]);
  hostOut_.reset(new float[elements]);
}

void Churn::tearDown() {
  phase_.set("teardown");
  CHECK(cuCtxSynchronize());
  for (const Buffer& buffer : kept_) CHECK(cuMemFree(buffer.pointer));
  kept_.clear();
  keptBytes_ = 0;
  for (std::size_t i = 1; i < streams_.size(); ++i) CHECK(cuStreamDestroy(streams_[i]));
  CHECK(cuModuleUnload(module_));
  CHECK(cuDevicePrimaryCtxRelease(device_));
  phase_.set("done");
}

// Log-uniform between 4 KiB and the maximum, so that small and huge buffers both come up often.
std::size_t Churn::randomBytes() {
  unsigned lowest = 12;  // log2(kMinBytes)
  unsigned highest = 12;
  while ((std::size_t{2} << highest) <= options_.maxBytes) ++highest;
  unsigned exponent = lowest + static_cast<unsigned>(rng_.below(highest - lowest + 1));
  std::size_t base = std::size_t{1} << exponent;
  std::size_t bytes = std::min(base + rng_.below(base), options_.maxBytes);
  return std::max(bytes & ~std::size_t{3}, kMinBytes);
}

CUstream Churn::randomStream() {
  return streams_[rng_.below(streams_.size())];
}

CUdeviceptr Churn::allocate(std::size_t bytes) {
  phase_.set("alloc");
  CUdeviceptr pointer;
  CHECK(cuMemAlloc(&pointer, bytes));
  return pointer;
}

void Churn::release(CUdeviceptr pointer) {
  phase_.set("free");
  CHECK(cuMemFree(pointer));
}

// A short kernel left in flight on some stream, so that some kills find queued GPU work that the
// daemon must drain or abandon before it can reclaim.
void Churn::maybeSpin() {
  if (!rng_.chance(30)) return;
  unsigned long long ns = 50'000 + rng_.below(950'000);
  void* params[] = {&ns};
  phase_.set("launch-spin");
  CHECK(cuLaunchKernel(spin_, 1, 1, 1, 1, 1, 1, 0, randomStream(), params, nullptr));
}

Buffer Churn::fillOnce() {
  Buffer buffer;
  buffer.bytes = randomBytes();
  buffer.pointer = allocate(buffer.bytes);
  buffer.pattern = Pattern::kFill;
  buffer.value = static_cast<std::uint32_t>(rng_.next());
  CUstream stream = randomStream();
  unsigned long long count = buffer.bytes / sizeof(std::uint32_t);
  void* params[] = {&buffer.pointer, &buffer.value, &count};
  unsigned grid = static_cast<unsigned>((count + kBlock - 1) / kBlock);
  phase_.set("launch-fill");
  CHECK(cuLaunchKernel(fill_, grid, 1, 1, kBlock, 1, 1, 0, stream, params, nullptr));
  verify(buffer, stream, "fill_u32");
  return buffer;
}

Buffer Churn::addOnce() {
  std::size_t bytes = randomBytes();
  int count = static_cast<int>(bytes / sizeof(float));
  auto offset = static_cast<std::uint32_t>(rng_.below(256));
  for (int i = 0; i < count; ++i) {
    hostA_[i] = addendA(i);
    hostB_[i] = addendB(i, offset);
  }
  CUdeviceptr a = allocate(bytes);
  CUdeviceptr b = allocate(bytes);
  CUdeviceptr c = allocate(bytes);
  CUstream stream = randomStream();
  phase_.set("copy-htod");
  if (rng_.chance(50)) {
    CHECK(cuMemcpyHtoDAsync(a, hostA_.get(), bytes, stream));
    CHECK(cuMemcpyHtoDAsync(b, hostB_.get(), bytes, stream));
  } else {
    CHECK(cuMemcpyHtoD(a, hostA_.get(), bytes));
    CHECK(cuMemcpyHtoD(b, hostB_.get(), bytes));
  }
  bytesCopied_ += 2 * bytes;
  void* params[] = {&a, &b, &c, &count};
  unsigned grid = (static_cast<unsigned>(count) + kBlock - 1) / kBlock;
  phase_.set("launch-add");
  CHECK(cuLaunchKernel(add_, grid, 1, 1, kBlock, 1, 1, 0, stream, params, nullptr));
  Buffer sum{c, bytes, Pattern::kSum, offset};
  verify(sum, stream, "vector_add");
  release(a);
  release(b);
  return sum;
}

// Copies `buffer` back (through `stream`) and checks every element against its pattern.
void Churn::verify(const Buffer& buffer, CUstream stream, const char* what) {
  std::size_t count = buffer.bytes / sizeof(float);
  // Poison first, so a copy that silently did nothing cannot pass on what an earlier one left.
  std::fill_n(hostOut_.get(), count, -1.0f);
  phase_.set("copy-dtoh");
  if (rng_.chance(50)) {
    CHECK(cuMemcpyDtoHAsync(hostOut_.get(), buffer.pointer, buffer.bytes, stream));
    phase_.set("sync");
    CHECK(cuStreamSynchronize(stream));
  } else {
    phase_.set("sync");
    CHECK(cuStreamSynchronize(stream));
    phase_.set("copy-dtoh");
    CHECK(cuMemcpyDtoH(hostOut_.get(), buffer.pointer, buffer.bytes));
  }
  bytesCopied_ += buffer.bytes;
  phase_.set("verify");
  for (std::size_t i = 0; i < count; ++i) {
    bool good;
    float expected = 0;
    if (buffer.pattern == Pattern::kFill) {
      std::uint32_t got;
      std::memcpy(&got, &hostOut_[i], sizeof(got));
      good = got == buffer.value;
      std::memcpy(&expected, &buffer.value, sizeof(expected));
    } else {
      expected = addendA(i) + addendB(i, buffer.value);
      good = hostOut_[i] == expected;
    }
    if (!good) {
      std::uint32_t gotBits, expectedBits;
      std::memcpy(&gotBits, &hostOut_[i], sizeof(gotBits));
      std::memcpy(&expectedBits, &expected, sizeof(expectedBits));
      char message[256];
      std::snprintf(message, sizeof(message),
                    "wrong result from %s: element %zu of %zu (buffer of %zu bytes) is 0x%08x, "
                    "expected 0x%08x (seed %llu, iteration %llu)",
                    what, i, count, buffer.bytes, gotBits, expectedBits,
                    static_cast<unsigned long long>(options_.seed),
                    static_cast<unsigned long long>(iterations_));
      die(message);
    }
  }
}

// Re-reads a kept buffer, sometimes through a device-to-device copy into a fresh one.
void Churn::checkKept() {
  if (kept_.empty()) return;
  const Buffer& kept = kept_[rng_.below(kept_.size())];
  if (rng_.chance(50)) {
    verify(kept, randomStream(), "a kept buffer");
    return;
  }
  Buffer copy = kept;
  copy.pointer = allocate(kept.bytes);
  CUstream stream = randomStream();
  phase_.set("copy-dtod");
  CHECK(cuMemcpyDtoDAsync(copy.pointer, kept.pointer, kept.bytes, stream));
  verify(copy, stream, "a device-to-device copy of a kept buffer");
  release(copy.pointer);
}

// Keeps about half the results (within --hold-bytes), and now and then lets an old one go, so
// the set of live allocations keeps changing.
void Churn::keepOrFree(const Buffer& buffer) {
  if (rng_.chance(50) && keptBytes_ + buffer.bytes <= options_.holdBytes) {
    kept_.push_back(buffer);
    keptBytes_ += buffer.bytes;
  } else {
    release(buffer.pointer);
  }
  if (!kept_.empty() && rng_.chance(20)) {
    std::size_t victim = rng_.below(kept_.size());
    release(kept_[victim].pointer);
    keptBytes_ -= kept_[victim].bytes;
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(victim));
  }
}

int Churn::run() {
  setUp();
  auto start = std::chrono::steady_clock::now();
  auto expired = [&] {
    return options_.seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >=
               options_.seconds;
  };
  while (!expired()) {
    maybeSpin();
    std::uint64_t choice = rng_.below(100);
    if (choice < 40) {
      keepOrFree(fillOnce());
    } else if (choice < 80) {
      keepOrFree(addOnce());
    } else {
      checkKept();
    }
    if (rng_.chance(25)) {
      phase_.set("ctx-sync");
      CHECK(cuCtxSynchronize());
    }
    ++iterations_;
  }
  tearDown();
  std::printf("churn: OK (%llu iterations, %llu bytes copied, seed %llu)\n",
              static_cast<unsigned long long>(iterations_),
              static_cast<unsigned long long>(bytesCopied_),
              static_cast<unsigned long long>(options_.seed));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--seed")
      options.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (arg == "--seconds")
      options.seconds = std::strtod(next().c_str(), nullptr);
    else if (arg == "--device")
      options.device = std::atoi(next().c_str());
    else if (arg == "--streams")
      options.streams = std::atoi(next().c_str());
    else if (arg == "--hold-bytes")
      options.holdBytes = std::strtoull(next().c_str(), nullptr, 10);
    else if (arg == "--max-bytes")
      options.maxBytes = std::strtoull(next().c_str(), nullptr, 10);
    else if (arg == "--phase-file")
      options.phaseFile = next();
    else {
      std::fprintf(stderr, "churn: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (options.maxBytes < kMinBytes || options.maxBytes > kMaxBytes) {
    die("--max-bytes must be between 4096 and 67108864");
  }
  if (options.streams < 0) die("--streams must not be negative");
  return Churn(options).run();
}
