// The interpreter driven directly: PTX decoded and launched over host memory, results checked.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "protocol/texture_header.hpp"
#include "server/backend/ptx/ptx_frontend.hpp"
#include "server/backend/ptx/ptx_interpreter.hpp"
#include "server/backend/ptx/ptx_numeric.hpp"

#if __has_include("test_kernels_ptx.hpp")
#include "test_kernels_ptx.hpp"
#define GPUPROXY_HAVE_TEST_KERNELS 1
#endif

namespace gpuproxy::server::ptx {
namespace {

constexpr char kHeader[] = ".version 8.0\n.target sm_75\n.address_size 64\n";

// A decoded module whose variables live in host memory, and a launcher over host buffers.
class Harness {
public:
  explicit Harness(std::string_view text, unsigned workers = 0) : interpreter_(workers) {
    DecodeResult decoded = decodePtx(text);
    status_ = decoded.status;
    message_ = decoded.message;
    if (!decoded.ok()) return;
    program_ = std::shared_ptr<const Program>(std::move(decoded.program));
    globals_.resize(std::max<std::uint64_t>(program_->globalBytes, 1));
    executable_ =
        std::make_unique<Executable>(program_, reinterpret_cast<std::uint64_t>(globals_.data()));
    const std::vector<std::byte> image = executable_->initialImage();
    if (!image.empty()) std::memcpy(globals_.data(), image.data(), image.size());
    for (const MemoryRange& range : executable_->variableRanges(globals_.data())) {
      ranges_.push_back(range);
    }
  }

  CUresult status() const { return status_; }
  const std::string& message() const { return message_; }
  const Program& program() const { return *program_; }

  // Lets kernels touch [data, data + bytes).
  void addRange(void* data, std::size_t bytes) {
    auto* begin = static_cast<std::byte*>(data);
    ranges_.push_back(MemoryRange{reinterpret_cast<std::uint64_t>(begin),
                                  reinterpret_cast<std::uint64_t>(begin) + bytes, begin, true});
  }

  template <typename T>
  void addRange(std::vector<T>& buffer) {
    addRange(buffer.data(), buffer.size() * sizeof(T));
  }

  LaunchOutcome launch(const std::string& kernel, std::array<std::uint32_t, 3> grid,
                       std::array<std::uint32_t, 3> block, const std::vector<std::uint64_t>& args,
                       std::uint32_t dynamicShared = 0, bool cooperative = false) {
    const Function* function = program_->findFunction(kernel);
    EXPECT_NE(function, nullptr) << kernel;
    if (function == nullptr) return {};
    std::vector<std::byte> parameters(function->kernelParameterBytes);
    EXPECT_EQ(args.size(), function->kernelParameters.size());
    for (std::size_t i = 0; i < args.size() && i < function->kernelParameters.size(); ++i) {
      const KernelParameter& parameter = function->kernelParameters[i];
      std::memcpy(parameters.data() + parameter.offset, &args[i],
                  std::min<std::size_t>(parameter.size, 8));
    }
    memory_ = MemoryMap(ranges_);
    LaunchRequest request;
    request.executable = executable_.get();
    request.kernel = static_cast<std::uint32_t>(function - program_->functions.data());
    for (int d = 0; d < 3; ++d) {
      request.grid[d] = grid[static_cast<std::size_t>(d)];
      request.block[d] = block[static_cast<std::size_t>(d)];
    }
    request.dynamicSharedBytes = dynamicShared;
    request.parameters = parameters;
    request.memory = &memory_;
    request.printf = &printf_;
    request.cooperative = cooperative;
    return interpreter_.run(request);
  }

  std::string output() { return printf_.take(); }
  std::byte* globals() { return globals_.data(); }

private:
  Interpreter interpreter_;
  CUresult status_ = CUDA_SUCCESS;
  std::string message_;
  std::shared_ptr<const Program> program_;
  std::vector<std::byte> globals_;
  std::unique_ptr<Executable> executable_;
  std::vector<MemoryRange> ranges_;
  MemoryMap memory_;
  PrintfBuffer printf_{1 << 20};
};

std::uint64_t address(const void* pointer) {
  return reinterpret_cast<std::uint64_t>(pointer);
}

// The header of a 2D texture of 4 x 2 floats, row-major in `texels`.
protocol::TextureHeader textureOf4x2(const std::vector<float>& texels) {
  protocol::TextureHeader texture;
  texture.base = address(texels.data());
  texture.pitch = 4 * sizeof(float);
  texture.slicePitch = texels.size() * sizeof(float);
  texture.width = 4;
  texture.height = 2;
  texture.dimensions = 2;
  return texture;
}

#ifdef GPUPROXY_HAVE_TEST_KERNELS

TEST(PtxInterpreter, VectorAddFromNvcc) {
  Harness harness(testing::kTestKernelsPtx);
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  constexpr int kCount = 1000;
  std::vector<float> a(kCount), b(kCount), c(kCount, -1.0f);
  for (int i = 0; i < kCount; ++i) {
    a[static_cast<std::size_t>(i)] = static_cast<float>(i);
    b[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
  }
  harness.addRange(a);
  harness.addRange(b);
  harness.addRange(c);
  const LaunchOutcome outcome =
      harness.launch("vector_add", {4, 1, 1}, {256, 1, 1},
                     {address(a.data()), address(b.data()), address(c.data()), kCount});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(c[static_cast<std::size_t>(i)], 1.5f * static_cast<float>(i)) << i;
  }
  EXPECT_GT(outcome.threadInstructions, 1000u * 10);
}

TEST(PtxInterpreter, StoreOutsideTheClientsMemoryFaults) {
  Harness harness(testing::kTestKernelsPtx);
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  const LaunchOutcome outcome = harness.launch("trap", {1, 1, 1}, {1, 1, 1}, {});
  EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(outcome.faultAddress, 8u);
  EXPECT_NE(outcome.message.find("trap"), std::string::npos) << outcome.message;
}

#endif

TEST(PtxInterpreter, DivergentLoopsReconverge) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .pred %p<3>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, 0;
  mov.u32 %r3, 0;
$loop:
  setp.ge.u32 %p1, %r3, %r1;
  @%p1 bra $done;
  add.u32 %r2, %r2, %r3;
  add.u32 %r3, %r3, 1;
  bra.uni $loop;
$done:
  activemask.b32 %r4;
  mul.wide.u32 %rd2, %r1, 8;
  add.u64 %rd3, %rd1, %rd2;
  st.global.v2.u32 [%rd3], {%r2, %r4};
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(2 * 64, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {64, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  for (std::uint32_t t = 0; t < 64; ++t) {
    EXPECT_EQ(out[2 * t], t == 0 ? 0 : t * (t - 1) / 2) << t;
    // After the loop every lane of the warp is back together.
    EXPECT_EQ(out[2 * t + 1], 0xffffffffu) << t;
  }
}

// CUB's warp scan, as its inline assembly writes it: registers declared in a nested scope without
// '%', and shfl's second result, the predicate "lane in range", paired with the first as "r0|p".
TEST(PtxInterpreter, InlineAssemblyScopesAndPairedShflPredicates) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .pred %p<10>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, 1;
  mov.u32 %r3, 1;
$step:
  {  .reg .u32 r0;  .reg .pred p;  shfl.sync.up.b32 r0|p, %r2, %r3, 0, -1;  @p add.u32 r0, r0, %r2;  mov.u32 %r2, r0;}
  shl.b32 %r3, %r3, 1;
  setp.lt.u32 %p9, %r3, 32;
  @%p9 bra $step;
  mul.wide.u32 %rd2, %r1, 4;
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r2;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(32, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  // An inclusive scan of ones: lane i holds i + 1.
  for (std::uint32_t lane = 0; lane < 32; ++lane) EXPECT_EQ(out[lane], lane + 1) << lane;
}

// Faults are exact, and each is the error a GPU reports.
TEST(PtxInterpreter, FaultsAreTheErrorsAGpuReports) {
  struct Case {
    const char* name;
    std::string body;
    CUresult expected;
    const char* message;
  };
  const Case cases[] = {
      {"misaligned",
       ".reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\nadd.u64 %rd2, %rd1, 2;\n"
       "st.global.u32 [%rd2], 7;",
       CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned"},
      {"outside", ".reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\nst.global.u32 [%rd1+4096], 7;",
       CUDA_ERROR_ILLEGAL_ADDRESS, "not memory of this client"},
      {"null", ".reg .b64 %rd<2>;\nmov.u64 %rd1, 0;\nld.u32 %rd1, [%rd1];",
       CUDA_ERROR_ILLEGAL_ADDRESS, "generic address 0x0"},
      {"shared past the end", ".shared .align 4 .b8 tile[16];\nst.shared.u32 [tile+16], 1;",
       CUDA_ERROR_ILLEGAL_ADDRESS, "shared memory"},
      {"trap", "trap;", CUDA_ERROR_ILLEGAL_INSTRUCTION, "trap"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Harness harness(std::string(kHeader) + ".visible .entry k(.param .u64 p)\n{\n" + c.body +
                    "\nret;\n}\n");
    ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
    std::vector<std::uint32_t> buffer(1024);
    harness.addRange(buffer);
    const LaunchOutcome outcome =
        harness.launch("k", {1, 1, 1}, {32, 1, 1}, {address(buffer.data())});
    EXPECT_EQ(outcome.status, c.expected) << outcome.message;
    EXPECT_NE(outcome.message.find(c.message), std::string::npos) << outcome.message;
    EXPECT_NE(outcome.message.find("kernel 'k'"), std::string::npos) << outcome.message;
  }
}

// Constant memory is read-only to kernels, as on a GPU.
TEST(PtxInterpreter, ConstantMemoryIsReadOnly) {
  Harness harness(std::string(kHeader) + R"(
.const .align 4 .u32 table[4] = {1, 2, 3, 4};
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.const.u32 %r1, [table+8];
  st.global.u32 [%rd1], %r1;
  mov.u64 %rd2, table;
  cvta.const.u64 %rd3, %rd2;
  st.u32 [%rd3], 9;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(1);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(out.data())});
  EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(outcome.message.find("read-only"), std::string::npos) << outcome.message;
  EXPECT_EQ(out[0], 3u);
}

// cudaGraphSetConditional, as nvcc emits it (an extern function the driver provides): the handle
// is the address of the conditional node's value, which the call stores; a handle that is not
// the client's memory faults as a bad store does.
TEST(PtxInterpreter, GraphSetConditionalStoresTheValueAtItsHandle) {
  Harness harness(std::string(kHeader) + R"(
.extern .func cudaGraphSetConditional
(
  .param .b64 cudaGraphSetConditional_param_0,
  .param .b32 cudaGraphSetConditional_param_1
)
;
.visible .entry k(.param .u64 handle, .param .u32 value)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [handle];
  ld.param.u32 %r1, [value];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  .param .b32 param1;
  st.param.b32 [param1+0], %r1;
  call.uni cudaGraphSetConditional, (param0, param1);
  }
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> value(1, 7);
  harness.addRange(value);
  LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(value.data()), 0});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(value[0], 0u);
  outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {address(value.data()), 5});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(value[0], 5u);
  outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {0x1000, 1});
  EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(outcome.faultAddress, 0x1000u);
}

// Unbounded recursion overflows the thread's stack and stops the launch instead of the daemon.
TEST(PtxInterpreter, RunawayRecursionOverflowsTheStack) {
  Harness harness(std::string(kHeader) + R"(
.func (.param .b32 r) down(.param .b32 x)
{
  .reg .b32 %r<3>;
  ld.param.b32 %r1, [x];
  add.s32 %r2, %r1, 1;
  {
    .param .b32 a;
    .param .b32 b;
    st.param.b32 [a], %r2;
    call.uni (b), down, (a);
    ld.param.b32 %r2, [b];
  }
  st.param.b32 [r], %r2;
  ret;
}
.visible .entry k(.param .u64 p)
{
  .reg .b32 %r<2>;
  {
    .param .b32 a;
    .param .b32 b;
    st.param.b32 [a], 0;
    call.uni (b), down, (a);
    ld.param.b32 %r1, [b];
  }
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {0});
  EXPECT_EQ(outcome.status, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_NE(outcome.message.find("stack overflow"), std::string::npos) << outcome.message;
}

// A barrier that can never complete (it waits for 64 threads of a 32-thread block) is reported,
// where a GPU would hang.
TEST(PtxInterpreter, ABarrierThatCannotCompleteIsADeadlock) {
  Harness harness(std::string(kHeader) +
                  ".visible .entry k(.param .u64 p)\n{\nbar.sync 1, 64;\nret;\n}\n");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {0});
  EXPECT_EQ(outcome.status, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_NE(outcome.message.find("deadlock"), std::string::npos) << outcome.message;
}

// Warps of a block that wait for each other through shared memory (no barrier) make progress:
// warps are scheduled cooperatively, with a budget of backward branches.
TEST(PtxInterpreter, WarpsSpinningOnSharedMemoryMakeProgress) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .shared .align 4 .u32 flag;
  .reg .pred %p<3>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<2>;
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %p1, %r1, 32;
  @%p1 bra $wait;
  st.volatile.shared.u32 [flag], 77;
  bra.uni $done;
$wait:
  ld.volatile.shared.u32 %r2, [flag];
  setp.ne.u32 %p2, %r2, 77;
  @%p2 bra $wait;
$done:
  ld.param.u64 %rd1, [out];
  ld.volatile.shared.u32 %r3, [flag];
  st.global.u32 [%rd1], %r3;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(1);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {64, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(out[0], 77u);
}

// Device printf is bounded like a GPU's buffer: what does not fit drops the oldest output.
TEST(PtxInterpreter, PrintfBufferDropsTheOldestOutput) {
  PrintfBuffer buffer(32);
  buffer.append("first line\n");
  buffer.append("second line\n");
  buffer.append("third line here\n");
  EXPECT_EQ(buffer.take(), "second line\nthird line here\n");
  EXPECT_EQ(buffer.takeLostBytes(), 11u);
  EXPECT_TRUE(buffer.empty());
}

// malloc and free in kernels come from the module's device heap.
TEST(PtxInterpreter, KernelsAllocateFromTheDeviceHeap) {
  DeviceHeap heap(0x100000, 4096);
  const std::uint64_t a = heap.allocate(100);
  const std::uint64_t b = heap.allocate(100);
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a % 16, 0u);
  EXPECT_EQ(heap.allocate(8192), 0u);  // more than the heap: NULL, as malloc on a GPU
  heap.release(a);
  heap.release(b);
  heap.release(12345);                        // not a block: ignored
  EXPECT_EQ(heap.allocate(4096), 0x100000u);  // freed blocks coalesced back
}

// __nv_aligned_device_malloc: blocks at the alignment asked for, the space before them still free;
// an alignment that is not a power of two gets NULL.
TEST(PtxInterpreter, AlignedAllocationsFromTheDeviceHeap) {
  DeviceHeap heap(0x100000, 8192);
  const std::uint64_t small = heap.allocate(16);
  EXPECT_EQ(small, 0x100000u);
  const std::uint64_t aligned = heap.allocate(100, 1024);
  EXPECT_EQ(aligned, 0x100400u);
  EXPECT_EQ(heap.allocate(16, 48), 0u);
  EXPECT_EQ(heap.allocate(16, 0), 0u);
  // The gap between the two blocks is used by later allocations.
  const std::uint64_t inGap = heap.allocate(32);
  EXPECT_EQ(inGap, 0x100010u);
  EXPECT_EQ(heap.allocate(8192, 4096), 0u);
  EXPECT_EQ(heap.allocate(4096, 4096), 0x101000u);
  heap.release(aligned);
  heap.release(small);
  heap.release(inGap);
  EXPECT_EQ(heap.allocate(4096, 4096), 0x100000u);  // coalesced again
}

// fns: the n-th set bit from a base, up or down (the PTX ISA's examples and the edges).
TEST(PtxInterpreter, FindNthSetBit) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [out];
  fns.b32 %r1, 0xaaaaaaaa, 3, 1;
  fns.b32 %r2, 0xaaaaaaaa, 3, -1;
  fns.b32 %r3, 0xaaaaaaaa, 2, 1;
  fns.b32 %r4, 0xaaaaaaaa, 2, -1;
  fns.b32 %r5, 0xaaaaaaaa, 2, 0;
  fns.b32 %r6, 0x000000f0, 0, 3;
  fns.b32 %r7, 0x000000f0, 0, 5;
  st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};
  st.global.v2.u32 [%rd1+16], {%r5, %r6};
  st.global.u32 [%rd1+24], %r7;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(8, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(out[0], 3u);
  EXPECT_EQ(out[1], 3u);
  EXPECT_EQ(out[2], 3u);
  EXPECT_EQ(out[3], 1u);
  EXPECT_EQ(out[4], 0xffffffffu);  // base not set
  EXPECT_EQ(out[5], 6u);
  EXPECT_EQ(out[6], 0xffffffffu);  // only four bits set
}

// Hexadecimal integers whose digits include an 'e' (inline assembly in CUDA's headers writes
// masks like 0xfffefffe and LUTs like 0x8E) are integers, not decimal floats with an exponent.
TEST(PtxInterpreter, HexadecimalIntegersWithAnEAreIntegers) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [out];
  mov.b32 %r1, -1;
  and.b32 %r2, %r1, 0xfffefffe;
  lop3.b32 %r3, %r1, 0, 0, 0x8E;
  st.global.v2.u32 [%rd1], {%r2, %r3};
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(2, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(out[0], 0xfffefffeu);
  EXPECT_EQ(out[1], 0u);  // LUT 0x8E at a=1, b=0, c=0 (index 4): bit 4 of 0x8E is 0
}

// The SIMD video instructions are executed (tests/programs/ptx_conformance checks their results);
// the scalar ones are refused by name, and a malformed lane mask is an invalid image.
TEST(PtxInterpreter, VideoInstructionsTheSimCannotRunAreNamed) {
  const auto kernel = [](const char* instruction) {
    return std::string(kHeader) + ".visible .entry k()\n{\n  .reg .b32 %r<4>;\n  " + instruction +
           "\n  ret;\n}\n";
  };
  Harness scalar(kernel("vadd.u32.u32.u32.add %r1, %r2, %r3, %r1;"));
  EXPECT_EQ(scalar.status(), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(scalar.message().find("scalar video instructions"), std::string::npos)
      << scalar.message();
  Harness badMask(kernel("vadd4.u32.u32.u32 %r1.b02, %r2, %r3, %r1;"));
  EXPECT_EQ(badMask.status(), CUDA_ERROR_INVALID_PTX) << badMask.message();
  Harness simd(kernel("vabsdiff4.u32.u32.u32.add %r1.b310, %r2.b7654, %r3.b0123, %r1;"));
  EXPECT_EQ(simd.status(), CUDA_SUCCESS) << simd.message();
}

// WARP_SZ is PTX's constant for the warp size (nvcc writes it for warpSize); the reserved shared
// memory a GPU sets aside per block (cooperative_groups keeps its multi-warp scratch at
// %reserved_smem_offset_1) follows the kernel's own, so using it overwrites none of the kernel's.
TEST(PtxInterpreter, WarpSizeAndTheReservedSharedMemory) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .shared .align 4 .b8 own[64];
  .reg .b32 %r<8>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, WARP_SZ;
  mov.u32 %r2, %reserved_smem_offset_begin;
  mov.u32 %r3, %reserved_smem_offset_end;
  mov.u32 %r4, %reserved_smem_offset_cap;
  mov.u32 %r5, %reserved_smem_offset_1;
  st.shared.u32 [own+60], 7;
  st.shared.u32 [%r5], 9;
  add.u32 %r6, %r3, -4;
  st.shared.u32 [%r6], 11;
  ld.shared.u32 %r7, [own+60];
  st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};
  st.global.v2.u32 [%rd1+16], {%r5, %r7};
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(6, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(out[0], 32u);
  EXPECT_GE(out[1], 64u) << "the reserved region starts after the kernel's own shared memory";
  EXPECT_EQ(out[2], out[1] + kReservedSharedBytes);
  EXPECT_EQ(out[3], kReservedSharedBytes);
  EXPECT_GE(out[4], out[1]);
  EXPECT_LE(out[4] + 288, out[2]) << "cooperative_groups expects 288 bytes from offset 1";
  EXPECT_EQ(out[5], 7u);
}

// A texture handle is the address of a header in the client's memory (tests/programs/cudart/
// textures checks the sampling itself): the header and the texels are read through the launch's
// memory checks, so a handle reaches nothing the client's own loads could not.
TEST(PtxInterpreter, TextureHandlesAreHeadersInTheClientsMemory) {
  const std::string text = std::string(kHeader) + R"(
.visible .entry sample(.param .u64 handle, .param .u64 out)
{
  .reg .b32 %r<2>;
  .reg .f32 %f<7>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [handle];
  ld.param.u64 %rd2, [out];
  mov.u32 %r1, %tid.x;
  cvt.rn.f32.u32 %f1, %r1;
  add.f32 %f1, %f1, 0f3F000000;
  mov.f32 %f2, 0f3F000000;
  tex.2d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd1, {%f1, %f2}];
  mul.wide.u32 %rd3, %r1, 8;
  add.u64 %rd4, %rd2, %rd3;
  st.global.v2.f32 [%rd4], {%f3, %f6};
  ret;
}
.visible .entry store(.param .u64 handle, .param .b32 x)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [handle];
  ld.param.b32 %r1, [x];
  mov.u32 %r2, 0;
  sust.b.2d.b32.trap [%rd1, {%r1, %r2}], {%r2};
  ret;
}
)";
  Harness harness(text);
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<float> texels = {1, 2, 3, 4, 5, 6, 7, 8};  // 4 x 2
  std::vector<float> out(2 * 6, -1.0f);
  std::vector<protocol::TextureHeader> headers(3);
  protocol::TextureHeader& texture = headers[0] = textureOf4x2(texels);
  protocol::TextureHeader& surface = headers[1] = texture;
  surface.kind = protocol::TextureHeaderKind::kSurface;
  protocol::TextureHeader& elsewhere = headers[2] = texture;
  std::vector<float> foreign(8);  // never added to the launch's memory
  elsewhere.base = address(foreign.data());
  harness.addRange(texels);
  harness.addRange(out);
  harness.addRange(headers);
  std::vector<std::uint64_t> notAHeader(32, 0x1234);
  harness.addRange(notAHeader);

  LaunchOutcome outcome =
      harness.launch("sample", {1, 1, 1}, {6, 1, 1}, {address(&texture), address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  // Row 0 point-sampled, clamped past its end; one channel, so alpha reads 1.
  const std::vector<float> expected = {1, 1, 2, 1, 3, 1, 4, 1, 4, 1, 4, 1};
  EXPECT_EQ(out, expected);

  const std::pair<std::uint64_t, const char*> refused[] = {
      {address(foreign.data()), "not memory of this client"},
      {address(notAHeader.data()), "names no texture object"},  // no header there
      {address(&surface), "names no texture object"},           // a surface's header
      {address(&elsewhere), "not memory of this client"},       // texels outside the client
  };
  for (const auto& [handle, message] : refused) {
    SCOPED_TRACE(message);
    outcome = harness.launch("sample", {1, 1, 1}, {6, 1, 1}, {handle, address(out.data())});
    EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS) << outcome.message;
    EXPECT_NE(outcome.message.find(message), std::string::npos) << outcome.message;
  }
  // A store past a surface's row with .trap faults; inside, it lands.
  outcome = harness.launch("store", {1, 1, 1}, {1, 1, 1}, {address(&surface), 12});
  EXPECT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(texels[3], 0.0f);
  outcome = harness.launch("store", {1, 1, 1}, {1, 1, 1}, {address(&surface), 16});
  EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS) << outcome.message;
  EXPECT_NE(outcome.message.find("outside the surface"), std::string::npos) << outcome.message;
}

// A cube map is a layered 2D array of square faces, six per cube; tex.cube takes the face of the
// direction's largest component and that face's coordinates (the programming guide's table), and
// tex.acube names the cube first.
TEST(PtxInterpreter, CubeMapsTakeTheFaceOfTheLargestComponent) {
  const std::string text = std::string(kHeader) + R"(
.visible .entry sample(.param .u64 handle, .param .u64 directions, .param .u64 out)
{
  .reg .b32 %r<3>;
  .reg .f32 %f<9>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [handle];
  ld.param.u64 %rd2, [directions];
  ld.param.u64 %rd3, [out];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd4, %r1, 16;
  add.u64 %rd5, %rd2, %rd4;
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];
  cvt.rzi.s32.f32 %r2, %f4;
  tex.cube.v4.f32.f32 {%f5, %f6, %f7, %f8}, [%rd1, {%f1, %f2, %f3, %f3}];
  mul.wide.u32 %rd6, %r1, 8;
  add.u64 %rd7, %rd3, %rd6;
  st.global.f32 [%rd7], %f5;
  tex.acube.v4.f32.f32 {%f5, %f6, %f7, %f8}, [%rd1, {%r2, %f1, %f2, %f3}];
  st.global.f32 [%rd7+4], %f5;
  ret;
}
)";
  Harness harness(text);
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  // Two cubes of 2 x 2 faces: texel (x, y) of face f of cube c holds 100 c + 10 f + 2 y + x.
  constexpr int kWidth = 2;
  std::vector<float> texels(2 * 6 * kWidth * kWidth);
  for (std::size_t i = 0; i < texels.size(); ++i) {
    const std::size_t x = i % 2, y = i / 2 % 2, f = i / 4 % 6, c = i / 24;
    texels[i] = static_cast<float>(100 * c + 10 * f + 2 * y + x);
  }
  protocol::TextureHeader cube;
  cube.base = address(texels.data());
  cube.pitch = kWidth * sizeof(float);
  cube.slicePitch = kWidth * kWidth * sizeof(float);
  cube.width = cube.height = kWidth;
  cube.depth = 12;
  cube.dimensions = 2;
  cube.layered = 1;
  cube.cubemap = 1;
  cube.flags = CU_TRSF_NORMALIZED_COORDINATES;
  // (x, y, z, cube) and what the face's table gives: face, s, t over |major|, (u, v) = ((s/m + 1)
  // / 2, (t/m + 1) / 2) across the face, at texel floor(2u), floor(2v).
  std::vector<float> directions = {
      1.0f,  -0.5f, -0.5f, 0,   // +x: s = -z, t = -y: (0.75, 0.75) -> texel (1, 1) of face 0
      -4.0f, 1.0f,  -2.0f, 1,   // -x: s = z, t = -y: (0.25, 0.375) -> texel (0, 0) of face 1
      0.5f,  2.0f,  0.5f,  1,   // +y: s = x, t = z: (0.625, 0.625) -> texel (1, 1) of face 2
      -0.5f, -1.0f, 0.5f,  0,   // -y: s = x, t = -z: (0.25, 0.25) -> texel (0, 0) of face 3
      0.5f,  -0.5f, 1.0f,  7,   // +z: s = x, t = -y: (0.75, 0.75) -> texel (1, 1) of face 4
      0.5f,  0.5f,  -1.0f, -3,  // -z: s = -x, t = -y: (0.25, 0.25) -> texel (0, 0) of face 5
  };
  std::vector<float> out(2 * 6, -1.0f);
  harness.addRange(texels);
  harness.addRange(directions);
  harness.addRange(out);
  std::vector<protocol::TextureHeader> headers = {cube};
  harness.addRange(headers);
  const LaunchOutcome outcome =
      harness.launch("sample", {1, 1, 1}, {6, 1, 1},
                     {address(headers.data()), address(directions.data()), address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  // tex.cube reads cube 0; tex.acube the cube named, clamped to the two there are.
  const std::vector<float> expected = {3, 3, 10, 110, 23, 123, 30, 30, 43, 143, 50, 50};
  EXPECT_EQ(out, expected);
}

TEST(PtxInterpreter, TexturesTheSimCannotSampleAreNamed) {
  const auto kernel = [](const char* instruction) {
    return std::string(kHeader) +
           ".visible .entry k(.param .u64 h)\n{\n  .reg .b32 %r<4>;\n  .reg .f32 %f<8>;\n"
           "  .reg .b64 %rd<2>;\n  ld.param.u64 %rd1, [h];\n  " +
           instruction + "\n  ret;\n}\n";
  };
  const std::pair<const char*, const char*> cases[] = {
      {"tex.2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r2, %r3, %r3}];", "multi-sample"},
      {"tld4.r.cube.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6, %f7, %f7}];",
       "tld4 of a cube map"},
      {"sust.p.2d.v4.b32.trap [%rd1, {%r1, %r2}], {%r1, %r2, %r3, %r3};", "sust.p"},
      {"sured.b.add.2d.u32.trap [%rd1, {%r1, %r2}], %r3;", "surface reductions"},
  };
  for (const auto& [instruction, message] : cases) {
    SCOPED_TRACE(instruction);
    Harness harness(kernel(instruction));
    EXPECT_EQ(harness.status(), CUDA_ERROR_NOT_SUPPORTED) << harness.message();
    EXPECT_NE(harness.message().find(message), std::string::npos) << harness.message();
  }
  // A cube map is addressed by a direction: integer coordinates are not PTX.
  Harness integerCube(
      kernel("tex.cube.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r2, %r3, %r3}];"));
  EXPECT_EQ(integerCube.status(), CUDA_ERROR_INVALID_PTX) << integerCube.message();
  Harness level(kernel("tex.level.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], %f7;"));
  EXPECT_EQ(level.status(), CUDA_SUCCESS) << level.message();
}

// stmatrix (compute capability 9.0; tests/programs/cudart/tensor_cores checks mma.sync, ldmatrix
// and movmatrix): lane l's register j holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
// matrix j, whose rows lanes 8j to 8j + 7 address; .trans stores the transpose.
TEST(PtxInterpreter, StmatrixStoresEachLanesPartOfTheMatrices) {
  for (const bool transpose : {false, true}) {
    SCOPED_TRACE(transpose ? "trans" : "plain");
    Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<16>;
  .reg .b64 %rd<4>;
  .shared .align 16 .b8 tile[256];
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  shl.b32 %r2, %r1, 1;
  add.u32 %r3, %r2, 1;
  shl.b32 %r3, %r3, 16;
  or.b32 %r4, %r2, %r3;
  add.u32 %r5, %r4, 0x00400040;
  shr.u32 %r6, %r1, 3;
  and.b32 %r6, %r6, 1;
  and.b32 %r7, %r1, 7;
  shl.b32 %r6, %r6, 7;
  shl.b32 %r7, %r7, 4;
  mov.u32 %r8, tile;
  add.u32 %r8, %r8, %r6;
  add.u32 %r8, %r8, %r7;
  stmatrix.sync.aligned.m8n8.x2)" +
                    std::string(transpose ? ".trans" : "") + R"(.shared.b16 [%r8], {%r4, %r5};
  bar.sync 0;
  shl.b32 %r9, %r1, 2;
  mov.u32 %r10, tile;
  add.u32 %r10, %r10, %r9;
  ld.shared.u32 %r11, [%r10];
  ld.shared.u32 %r12, [%r10+128];
  cvt.u64.u32 %rd2, %r9;
  add.u64 %rd2, %rd1, %rd2;
  st.global.u32 [%rd2], %r11;
  st.global.u32 [%rd2+128], %r12;
  ret;
}
)");
    ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
    std::vector<std::uint16_t> out(128, 0xffff);
    harness.addRange(out);
    const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {address(out.data())});
    ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
    // Lane l held elements 2l and 2l + 1 of matrix 0 (64 more in matrix 1): row-major order.
    for (unsigned matrix = 0; matrix < 2; ++matrix) {
      for (unsigned row = 0; row < 8; ++row) {
        for (unsigned column = 0; column < 8; ++column) {
          const unsigned element = transpose ? column * 8 + row : row * 8 + column;
          EXPECT_EQ(out[matrix * 64 + row * 8 + column], matrix * 64 + element)
              << "matrix " << matrix << " [" << row << "][" << column << "]";
        }
      }
    }
  }
}

// Blocks run on worker threads too: every block of a large launch runs exactly once.
TEST(PtxInterpreter, WorkersShareTheBlocksOfALaunch) {
#ifdef GPUPROXY_HAVE_TEST_KERNELS
  Harness harness(testing::kTestKernelsPtx, 3);
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  constexpr unsigned kCount = 1 << 18;
  std::vector<std::uint32_t> data(kCount, 0);
  harness.addRange(data);
  const LaunchOutcome outcome = harness.launch("fill_u32", {kCount / 64, 1, 1}, {64, 1, 1},
                                               {address(data.data()), 0xabcdu, kCount});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(std::count(data.begin(), data.end(), 0xabcdu), static_cast<std::ptrdiff_t>(kCount));
#endif
}

// A vector access to global memory is one access, as on a GPU: another thread never sees half of
// it. CUB's decoupled look-back (Thrust's scan) reads a tile's status and value together with one
// ld.v2/ld.v4 and relies on this. The host writes whole 16-byte words while the kernel reads them
// (ld.v4 and ld.v2), and reads whole words while the kernel writes them (st.v4).
TEST(PtxInterpreter, VectorAccessesToGlobalMemoryAreNeverTorn) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 slot, .param .u64 sink, .param .u64 torn, .param .u32 n)
{
  .reg .pred %p<6>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [slot];
  ld.param.u64 %rd2, [sink];
  ld.param.u64 %rd3, [torn];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, 0;
  mov.u32 %r3, 0;
$loop:
  ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd1];
  setp.ne.u32 %p1, %r4, %r7;
  setp.ne.u32 %p2, %r5, %r6;
  or.pred %p3, %p1, %p2;
  ld.global.v2.u32 {%r8, %r9}, [%rd1];
  setp.ne.u32 %p4, %r8, %r9;
  or.pred %p3, %p3, %p4;
  selp.u32 %r10, 1, 0, %p3;
  add.u32 %r3, %r3, %r10;
  st.global.v4.u32 [%rd2], {%r2, %r2, %r2, %r2};
  add.u32 %r2, %r2, 1;
  setp.lt.u32 %p5, %r2, %r1;
  @%p5 bra $loop;
  st.global.u32 [%rd3], %r3;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  using Word = unsigned __int128;
  alignas(16) std::array<std::uint32_t, 4> slot{};
  alignas(16) std::array<std::uint32_t, 4> sink{};
  std::uint32_t kernelSawTorn = 0;
  harness.addRange(slot.data(), sizeof slot);
  harness.addRange(sink.data(), sizeof sink);
  harness.addRange(&kernelSawTorn, sizeof kernelSawTorn);

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> writes{0};
  std::uint64_t hostSawTorn = 0;
  std::thread host([&] {
    auto* slotWord = reinterpret_cast<Word*>(slot.data());
    auto* sinkWord = reinterpret_cast<Word*>(sink.data());
    for (std::uint32_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      const std::array<std::uint32_t, 4> same{k, k, k, k};
      Word value;
      std::memcpy(&value, same.data(), sizeof value);
      __atomic_store_n(slotWord, value, __ATOMIC_RELAXED);
      const Word seen = __atomic_load_n(sinkWord, __ATOMIC_RELAXED);
      std::array<std::uint32_t, 4> parts;
      std::memcpy(parts.data(), &seen, sizeof seen);
      if (parts[0] != parts[3] || parts[1] != parts[2]) ++hostSawTorn;
      writes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (writes.load(std::memory_order_relaxed) < 1000) std::this_thread::yield();
  const LaunchOutcome outcome =
      harness.launch("k", {1, 1, 1}, {1, 1, 1},
                     {address(slot.data()), address(sink.data()), address(&kernelSawTorn), 200000});
  stop = true;
  host.join();
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(kernelSawTorn, 0u);
  EXPECT_EQ(hostSawTorn, 0u);
}

// cp.async (compute capability 8.0): copies to shared memory of 4, 8 and 16 bytes, a source size
// smaller than the copy (the rest zero-filled), a predicate that ignores the source, a cache
// hint; the group operations wait for them.
TEST(PtxInterpreter, AsynchronousCopiesToSharedMemory) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 in, .param .u64 out)
{
  .shared .align 16 .b8 staged[64];
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [in];
  ld.param.u64 %rd2, [out];
  mov.u32 %r1, staged;
  mov.u32 %r2, 6;
  setp.eq.u32 %p1, %r2, 6;
  createpolicy.fractional.L2::evict_last.b64 %rd3, 1.0;
  cp.async.ca.shared.global [%r1], [%rd1], 4;
  cp.async.ca.shared.global [%r1+8], [%rd1+8], 8, 8;
  cp.async.cg.shared.global [%r1+16], [%rd1+16], 16, %r2;
  cp.async.cg.shared.global.L2::cache_hint [%r1+32], [%rd1+32], 16, %rd3;
  cp.async.ca.shared.global [%r1+48], [%rd1+48], 16, %p1;
  cp.async.commit_group;
  cp.async.wait_group 0;
  cp.async.wait_all;
  ld.shared.v4.u32 {%r3, %r4, %r5, %r6}, [%r1];
  st.global.v4.u32 [%rd2], {%r3, %r4, %r5, %r6};
  ld.shared.v4.u32 {%r3, %r4, %r5, %r6}, [%r1+16];
  st.global.v4.u32 [%rd2+16], {%r3, %r4, %r5, %r6};
  ld.shared.v4.u32 {%r3, %r4, %r5, %r6}, [%r1+32];
  st.global.v4.u32 [%rd2+32], {%r3, %r4, %r5, %r6};
  ld.shared.v4.u32 {%r3, %r4, %r5, %r6}, [%r1+48];
  st.global.v4.u32 [%rd2+48], {%r3, %r4, %r5, %r6};
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  alignas(16) std::array<std::uint8_t, 64> in;
  std::iota(in.begin(), in.end(), std::uint8_t{1});
  alignas(16) std::array<std::uint8_t, 64> out;
  out.fill(0xee);
  harness.addRange(in.data(), in.size());
  harness.addRange(out.data(), out.size());
  const LaunchOutcome outcome =
      harness.launch("k", {1, 1, 1}, {1, 1, 1}, {address(in.data()), address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  std::array<std::uint8_t, 64> expected{};
  for (unsigned i = 0; i < 4; ++i) expected[i] = in[i];         // 4 bytes
  for (unsigned i = 4; i < 8; ++i) expected[i] = out[i];        // not copied: whatever was there
  for (unsigned i = 8; i < 16; ++i) expected[i] = in[i];        // 8 bytes
  for (unsigned i = 16; i < 22; ++i) expected[i] = in[i];       // 6 of 16, then zeros
  for (unsigned i = 32; i < 48; ++i) expected[i] = in[i];       // 16 bytes, cache hint
  EXPECT_EQ(std::vector<std::uint8_t>(out.begin(), out.end()),  // 16 ignored: zeros
            std::vector<std::uint8_t>(expected.begin(), expected.end()));
}

// A cp.async whose source is not the client's memory faults like a load.
TEST(PtxInterpreter, AnAsynchronousCopyFromForeignMemoryFaults) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 in)
{
  .shared .align 16 .b8 staged[16];
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [in];
  mov.u32 %r1, staged;
  cp.async.cg.shared.global [%r1], [%rd1], 16;
  cp.async.wait_all;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {1, 1, 1}, {0x1000});
  EXPECT_EQ(outcome.status, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(outcome.faultAddress, 0x1000u);
}

// wmma: a warp loads f16 tiles of A (row-major) and B (column-major) and an f32 C, multiplies and
// accumulates, and stores D over C; a load from memory that is not the client's faults.
TEST(PtxInterpreter, TensorCoreTilesMultiplyAsTheHostDoes) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry tile(.param .u64 a, .param .u64 b, .param .u64 c)
{
  .reg .f32 %f<17>;
  .reg .b32 %r<18>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  ld.param.u64 %rd3, [c];
  mov.u32 %r1, 16;
  wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {%r2, %r3, %r4, %r5, %r6, %r7, %r8, %r9}, [%rd1], %r1;
  wmma.load.b.sync.aligned.col.m16n16k16.global.f16 {%r10, %r11, %r12, %r13, %r14, %r15, %r16, %r17}, [%rd2], %r1;
  wmma.load.c.sync.aligned.row.m16n16k16.global.f32 {%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8}, [%rd3], %r1;
  wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {%f9, %f10, %f11, %f12, %f13, %f14, %f15, %f16}, {%r2, %r3, %r4, %r5, %r6, %r7, %r8, %r9}, {%r10, %r11, %r12, %r13, %r14, %r15, %r16, %r17}, {%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8};
  wmma.store.d.sync.aligned.row.m16n16k16.global.f32 [%rd3], {%f9, %f10, %f11, %f12, %f13, %f14, %f15, %f16}, %r1;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  // Small integers: f16 holds them exactly, and their products sum exactly in f32.
  auto value = [](int i, int salt) { return static_cast<float>((i * 7 + salt) % 9 - 4); };
  std::vector<std::uint16_t> a(256), b(256);
  std::vector<float> c(256);
  for (int i = 0; i < 256; ++i) {
    a[static_cast<std::size_t>(i)] = toHalf(value(i, 1));
    b[static_cast<std::size_t>(i)] = toHalf(value(i, 2));
    c[static_cast<std::size_t>(i)] = value(i, 3);
  }
  const std::vector<float> before = c;
  harness.addRange(a);
  harness.addRange(b);
  harness.addRange(c);
  const LaunchOutcome outcome = harness.launch(
      "tile", {1, 1, 1}, {32, 1, 1}, {address(a.data()), address(b.data()), address(c.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  for (int row = 0; row < 16; ++row) {
    for (int column = 0; column < 16; ++column) {
      float expected = before[static_cast<std::size_t>(row * 16 + column)];
      for (int k = 0; k < 16; ++k) expected += value(row * 16 + k, 1) * value(column * 16 + k, 2);
      EXPECT_EQ(c[static_cast<std::size_t>(row * 16 + column)], expected) << row << "," << column;
    }
  }
  const LaunchOutcome foreign =
      harness.launch("tile", {1, 1, 1}, {32, 1, 1}, {0x1000, address(b.data()), address(c.data())});
  EXPECT_EQ(foreign.status, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_NE(foreign.message.find("wmma.load.a"), std::string::npos) << foreign.message;
}

// Immediates written inside a vector operand (a fragment, a texture's coordinates, a surface
// store's value) are values like any other operand's, never rows of the frame.
TEST(PtxInterpreter, ImmediatesInVectorOperandsAreValues) {
  Harness harness(R"(.version 8.0
.target sm_80
.address_size 64
.visible .entry ones(.param .u64 out)
{
  .reg .f32 %f<5>;
  .reg .b32 %r<2>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  mov.b32 %r1, 0x3C003C00;
  mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, 0x3C003C00}, {%r1}, {0f3F800000, 0f3F800000, 0f3F800000, 0f3F800000};
  mov.u32 %r1, %laneid;
  mul.wide.u32 %rd2, %r1, 16;
  add.u64 %rd3, %rd1, %rd2;
  st.global.v4.f32 [%rd3], {%f1, %f2, %f3, %f4};
  ret;
}
.visible .entry surface(.param .u64 surface, .param .u64 texture, .param .u64 out)
{
  .reg .f32 %f<5>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [surface];
  ld.param.u64 %rd2, [out];
  ld.param.u64 %rd3, [texture];
  sust.b.2d.b32.trap [%rd1, {4, 1}], {0x40A00000};
  tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd3, {0f3FC00000, 0f3FC00000}];
  st.global.f32 [%rd2], %f1;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  // A and B all ones, C ones: every element of D is 8 products of 1 plus 1.
  std::vector<float> out(32 * 4, 0.0f);
  harness.addRange(out);
  LaunchOutcome outcome = harness.launch("ones", {1, 1, 1}, {32, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(out, std::vector<float>(32 * 4, 9.0f));

  // sust writes 5.0f at byte 4 of row 1 (texel (1, 1)); tex point-samples (1.5, 1.5), that texel.
  std::vector<float> texels(8, 0.0f);  // 4 x 2
  std::vector<protocol::TextureHeader> headers(2);
  protocol::TextureHeader& texture = headers[0] = textureOf4x2(texels);
  protocol::TextureHeader& surface = headers[1] = texture;
  surface.kind = protocol::TextureHeaderKind::kSurface;
  harness.addRange(texels);
  harness.addRange(headers);
  outcome = harness.launch("surface", {1, 1, 1}, {1, 1, 1},
                           {address(&surface), address(&texture), address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(texels[5], 5.0f);
  EXPECT_EQ(out[0], 5.0f);
}

// mbarrier objects: every thread of two warps arrives and waits for the phase (warps take turns
// while they spin); the parity forms see phase 0 complete; the arrival state carries the pending
// count; then warp 1 leaves with arrive_drop and warp 0 completes two phases on its own. Waits are
// bounded, so a phase that never completes is a wrong answer rather than a hang.
TEST(PtxInterpreter, MbarrierPhasesCompleteWhenEveryExpectedThreadArrived) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .shared .align 8 .b64 bar;
  .reg .pred %p<4>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd4, %r1, 16;
  add.u64 %rd5, %rd1, %rd4;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra $ready;
  mbarrier.init.shared.b64 [bar], 64;
$ready:
  bar.sync 0;
  mov.u32 %r9, 0;
  mbarrier.arrive.shared.b64 %rd2, [bar];
$wait0:
  add.u32 %r9, %r9, 1;
  setp.gt.u32 %p1, %r9, 100000;
  @%p1 bra $fail;
  mbarrier.test_wait.shared.b64 %p2, [bar], %rd2;
  @!%p2 bra $wait0;
  mbarrier.try_wait.parity.shared.b64 %p3, [bar], 0;
  selp.u32 %r2, 1, 0, %p3;
  mbarrier.test_wait.parity.shared.b64 %p3, [bar], 1;
  selp.u32 %r3, 2, 0, %p3;
  or.b32 %r2, %r2, %r3;
  mbarrier.pending_count.b64 %r4, %rd2;
  st.global.v2.u32 [%rd5], {%r2, %r4};
  setp.ge.u32 %p1, %r1, 32;
  @%p1 bra $leave;
  mov.u32 %r9, 0;
  mbarrier.arrive.shared.b64 %rd3, [bar];
$wait1:
  add.u32 %r9, %r9, 1;
  setp.gt.u32 %p1, %r9, 100000;
  @%p1 bra $fail;
  mbarrier.test_wait.shared.b64 %p2, [bar], %rd3;
  @!%p2 bra $wait1;
  mov.u32 %r9, 0;
  mbarrier.arrive.shared.b64 %rd3, [bar];
$wait2:
  add.u32 %r9, %r9, 1;
  setp.gt.u32 %p1, %r9, 100000;
  @%p1 bra $fail;
  mbarrier.try_wait.shared.b64 %p2, [bar], %rd3;
  @!%p2 bra $wait2;
  st.global.u32 [%rd5+8], 7;
  ret;
$leave:
  mbarrier.arrive_drop.shared.b64 _, [bar];
  st.global.u32 [%rd5+8], 9;
  ret;
$fail:
  st.global.u32 [%rd5+8], 666;
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(64 * 4, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {64, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  std::vector<std::uint32_t> pending;
  for (std::uint32_t t = 0; t < 64; ++t) {
    EXPECT_EQ(out[t * 4], 1u) << "parity seen by thread " << t;
    pending.push_back(out[t * 4 + 1]);
    EXPECT_EQ(out[t * 4 + 2], t < 32 ? 7u : 9u) << "how thread " << t << " ended";
  }
  // The threads arrived one after another (in whatever order): each saw one arrival fewer pending.
  std::sort(pending.begin(), pending.end());
  std::vector<std::uint32_t> oneToSixtyFour(64);
  std::iota(oneToSixtyFour.begin(), oneToSixtyFour.end(), 1u);
  EXPECT_EQ(pending, oneToSixtyFour);
}

// Lanes of one warp instruction may name different member masks, as cooperative_groups tiles of
// 16 do (each its own half of the warp): redux, vote.ballot, match.any and elect each stay within
// the lane's own mask.
TEST(PtxInterpreter, WarpExchangesStayWithinEachLanesMemberMask) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 out)
{
  .reg .pred %p<2>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %laneid;
  and.b32 %r2, %r1, -16;
  mov.u32 %r3, 65535;
  shl.b32 %r4, %r3, %r2;
  redux.sync.add.u32 %r5, %r1, %r4;
  and.b32 %r6, %r1, 1;
  setp.eq.u32 %p1, %r6, 1;
  vote.sync.ballot.b32 %r7, %p1, %r4;
  and.b32 %r8, %r1, 3;
  match.any.sync.b32 %r9, %r8, %r4;
  elect.sync %r10|%p1, %r4;
  selp.u32 %r11, 1, 0, %p1;
  mul.wide.u32 %rd2, %r1, 32;
  add.u64 %rd3, %rd1, %rd2;
  st.global.v4.u32 [%rd3], {%r5, %r7, %r9, %r4};
  st.global.v2.u32 [%rd3+16], {%r10, %r11};
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  std::vector<std::uint32_t> out(32 * 8, 0);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {1, 1, 1}, {32, 1, 1}, {address(out.data())});
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  for (std::uint32_t lane = 0; lane < 32; ++lane) {
    const std::uint32_t half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    EXPECT_EQ(out[lane * 8], lane < 16 ? 120u : 376u) << "redux total of lane " << lane;
    EXPECT_EQ(out[lane * 8 + 1], 0xaaaaaaaau & half) << "ballot of lane " << lane;
    EXPECT_EQ(out[lane * 8 + 2], (0x11111111u << (lane & 3)) & half) << "match of lane " << lane;
    EXPECT_EQ(out[lane * 8 + 4], lane < 16 ? 0u : 16u) << "leader elected for lane " << lane;
    EXPECT_EQ(out[lane * 8 + 5], lane == 0 || lane == 16 ? 1u : 0u)
        << "lane " << lane << " elected";
  }
}

// A cooperative launch holds every block at once: blocks that wait for each other through global
// memory (a grid barrier of their own, and the workspace %envreg1/%envreg2 name, which
// cooperative_groups' grid.sync() uses) all finish, with one interpreter thread. %envreg reads 0
// in an ordinary launch.
TEST(PtxInterpreter, ACooperativeGridHoldsEveryBlockAtOnce) {
  Harness harness(std::string(kHeader) + R"(
.visible .entry k(.param .u64 counter, .param .u64 out)
{
  .reg .pred %p<3>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [counter];
  ld.param.u64 %rd2, [out];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %nctaid.x;
  mov.u32 %r3, %tid.x;
  setp.ne.u32 %p1, %r3, 0;
  @%p1 bra $done;
  atom.add.release.gpu.u32 %r4, [%rd1], 1;
$wait:
  ld.acquire.gpu.u32 %r5, [%rd1];
  setp.lt.u32 %p2, %r5, %r2;
  @%p2 bra $wait;
  mov.u32 %r6, %envreg1;
  mov.u32 %r7, %envreg2;
  cvt.u64.u32 %rd3, %r6;
  cvt.u64.u32 %rd4, %r7;
  shl.b64 %rd3, %rd3, 32;
  or.b64 %rd3, %rd3, %rd4;
  setp.eq.u64 %p2, %rd3, 0;
  @%p2 bra $record;
  ld.global.u32 %r5, [%rd3];
$record:
  mul.wide.u32 %rd5, %r1, 4;
  add.u64 %rd6, %rd2, %rd5;
  st.global.u32 [%rd6], %r5;
$done:
  ret;
}
)");
  ASSERT_EQ(harness.status(), CUDA_SUCCESS) << harness.message();
  constexpr std::uint32_t kBlocks = 24;
  std::vector<std::uint32_t> counter(1, 0), out(kBlocks, 0);
  harness.addRange(counter);
  harness.addRange(out);
  const LaunchOutcome outcome = harness.launch("k", {kBlocks, 1, 1}, {64, 1, 1},
                                               {address(counter.data()), address(out.data())},
                                               /*dynamicShared=*/0, /*cooperative=*/true);
  ASSERT_EQ(outcome.status, CUDA_SUCCESS) << outcome.message;
  EXPECT_EQ(counter[0], kBlocks);
  // Each block read the workspace's first word: its size, as the driver ABI lays it out.
  for (std::uint32_t block = 0; block < kBlocks; ++block) EXPECT_EQ(out[block], 8u) << block;
  // An ordinary launch of one block: %envreg is 0, so the block records the counter instead.
  counter[0] = 0;
  const LaunchOutcome ordinary =
      harness.launch("k", {1, 1, 1}, {64, 1, 1}, {address(counter.data()), address(out.data())});
  ASSERT_EQ(ordinary.status, CUDA_SUCCESS) << ordinary.message;
  EXPECT_EQ(out[0], 1u);
}

}  // namespace
}  // namespace gpuproxy::server::ptx
