// The PTX front end: what it accepts, what it refuses and how loudly, and the layout it decodes.

#include <gtest/gtest.h>

#include <string>

#include "server/backend/ptx/ptx_frontend.hpp"

namespace gpuproxy::server::ptx {
namespace {

const std::string kHeader = ".version 8.0\n.target sm_80\n.address_size 64\n";

DecodeResult decode(const std::string& body) {
  return decodePtx(kHeader + body);
}

std::string kernel(const std::string& name, const std::string& body) {
  return ".visible .entry " + name + "(.param .u64 p)\n{\n" + body + "\nret;\n}\n";
}

// Valid PTX the interpreter does not execute: refused at load with NOT_SUPPORTED, naming the
// instruction and the kernel.
TEST(PtxFrontend, UnsupportedInstructionsAreRefusedByName) {
  const std::pair<std::string, std::string> cases[] = {
      {"tex.2d.v4.f32.f32",
       ".reg .f32 %f<5>; .reg .b64 %rd<2>;\n"
       "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f1, %f2}];"},
      {"mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32",
       ".reg .b32 %r<4>; .reg .f32 %f<8>;\n"
       "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, {%r0, %r1}, "
       "{%r2}, {%f4, %f5, %f6, %f7};"},
      {"cp.async.ca.shared.global",
       ".reg .b32 %r<2>; .reg .b64 %rd<2>;\n"
       "cp.async.ca.shared.global [%r1], [%rd1], 16;"},
      {"ldmatrix.sync.aligned.m8n8.x1.shared.b16",
       ".reg .b32 %r<3>;\n"
       "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r1}, [%r2];"},
      {"suld.b.1d.b32.trap",
       ".reg .b32 %r<3>; .reg .b64 %rd<2>;\n"
       "suld.b.1d.b32.trap {%r1}, [%rd1, {%r2}];"},
      {"alloca.u64", ".reg .b64 %rd<3>;\nalloca.u64 %rd1, %rd2;"},
  };
  for (const auto& [instruction, body] : cases) {
    SCOPED_TRACE(instruction);
    const DecodeResult result = decode(kernel("uses_it", body));
    EXPECT_EQ(result.status, CUDA_ERROR_NOT_SUPPORTED) << result.message;
    EXPECT_NE(result.message.find(instruction), std::string::npos) << result.message;
    EXPECT_NE(result.message.find("uses_it"), std::string::npos) << result.message;
  }
  // Texture references and clusters at module level or on a kernel.
  EXPECT_EQ(decode(".global .texref tex;\n" + kernel("k", "")).status, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(decode(".visible .entry k() .reqnctapercluster 2, 1, 1 { ret; }").status,
            CUDA_ERROR_NOT_SUPPORTED);
  // A call to an external function the sim does not provide.
  const DecodeResult external =
      decode(".extern .func (.param .b32 r) mystery(.param .b32 a);\n" +
             kernel("k",
                    "{ .param .b32 a; .param .b32 r; st.param.b32 [a], 1;\n"
                    "call.uni (r), mystery, (a); }"));
  EXPECT_EQ(external.status, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(external.message.find("mystery"), std::string::npos) << external.message;
}

TEST(PtxFrontend, MalformedTextIsInvalidPtx) {
  const std::string cases[] = {
      kernel("k", ".reg .b32 %r<2>;\nadd.s32 %r1, %r1, 1"),  // no semicolon
      kernel("k", "bra.uni $nowhere;"),                      // undefined label
      kernel("k", "add.s32 %r1, %r1, 1;"),                   // undeclared register
      kernel("k", "$a:\n$a:\n"),                             // duplicate label
      kernel("k", ".reg .b32 %r<2>;\nmov.b32 %r1, 0xzz;"),   // bad number
      kernel("k", ".reg .b32 %r<2>;\nadd.s32 %r1, %r1;"),    // operand count
      ".visible .entry k(.param .u64 p { ret; }",            // unclosed list
      ".visible .entry k() { ret; ",                         // unclosed body
      "garbage at module level;",
  };
  for (const std::string& body : cases) {
    SCOPED_TRACE(body);
    const DecodeResult result = decode(body);
    EXPECT_EQ(result.status, CUDA_ERROR_INVALID_PTX) << result.message;
    EXPECT_FALSE(result.message.empty());
    EXPECT_EQ(result.program, nullptr);
  }
  EXPECT_EQ(decodePtx(kernel("k", "")).status, CUDA_ERROR_INVALID_PTX);  // no .version/.target
}

TEST(PtxFrontend, ModuleVariablesAreLaidOutAndInitialised) {
  const DecodeResult result = decode(R"(
.global .align 4 .u32 counter = 41;
.const .align 8 .f64 coefficients[2] = {0d3FF0000000000000, 0dC000000000000000};
.global .align 8 .u64 pointer = counter;
.global .align 1 .b8 bytes[3] = {1, 2, 3};
.visible .entry k() { ret; }
)");
  ASSERT_TRUE(result.ok()) << result.message;
  const Program& program = *result.program;
  const Variable* counter = program.findVariable("counter");
  const Variable* coefficients = program.findVariable("coefficients");
  const Variable* pointer = program.findVariable("pointer");
  ASSERT_NE(counter, nullptr);
  ASSERT_NE(coefficients, nullptr);
  ASSERT_NE(pointer, nullptr);
  EXPECT_EQ(counter->bytes, 4u);
  EXPECT_EQ(coefficients->bytes, 16u);
  EXPECT_EQ(counter->initializer, (std::vector<std::uint8_t>{41, 0, 0, 0}));
  ASSERT_EQ(pointer->relocations.size(), 1u);
  // Constant memory comes after the writable variables, where it can be mapped read-only.
  const auto offsetOf = [&](const Variable* variable) {
    return program.globalOffsets[static_cast<std::size_t>(variable - program.variables.data())];
  };
  EXPECT_GE(offsetOf(coefficients), program.constOffset);
  EXPECT_LT(offsetOf(counter), program.constOffset);
  EXPECT_EQ(offsetOf(pointer) % 8, 0u);
}

TEST(PtxFrontend, KernelAttributesComeFromThePtx) {
  const DecodeResult result = decode(R"(
.visible .entry k(.param .u8 a, .param .align 16 .b8 s[40], .param .u64 p) .maxntid 128, 2, 1
{
  .local .align 8 .b8 depot[64];
  .shared .align 4 .b8 tile[1024];
  ret;
}
.visible .entry exact() .reqntid 32, 4, 1 { ret; }
)");
  ASSERT_TRUE(result.ok()) << result.message;
  const Function* k = result.program->findFunction("k");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->kernelParameters.size(), 3u);
  EXPECT_EQ(k->kernelParameters[0].offset, 0u);
  EXPECT_EQ(k->kernelParameters[1].offset, 16u);
  EXPECT_EQ(k->kernelParameters[1].size, 40u);
  EXPECT_EQ(k->kernelParameters[2].offset, 56u);
  EXPECT_EQ(k->kernelParameterBytes, 64u);
  EXPECT_EQ(k->maxThreads, 256u);
  EXPECT_EQ(k->localBytes, 64u);
  EXPECT_EQ(k->ownSharedBytes, 1024u);
  const Function* exact = result.program->findFunction("exact");
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(exact->maxThreads, 128u);
  EXPECT_EQ(exact->requiredThreads[1], 4u);
}

// Dynamic shared memory starts at one offset for every kernel, past every kernel's own.
TEST(PtxFrontend, DynamicSharedMemoryFollowsTheLargestStaticLayout) {
  const DecodeResult result = decode(R"(
.extern .shared .align 16 .b8 dynamic[];
.visible .entry small() { .shared .align 4 .b8 a[100]; ret; }
.visible .entry large() { .shared .align 4 .b8 b[3000]; ret; }
)");
  ASSERT_TRUE(result.ok()) << result.message;
  EXPECT_EQ(result.program->staticSharedBytes, 3000u);
  EXPECT_EQ(result.program->dynamicSharedOffset, 3008u);
  EXPECT_EQ(result.program->findFunction("small")->ownSharedBytes, 100u);
}

}  // namespace
}  // namespace gpuproxy::server::ptx
