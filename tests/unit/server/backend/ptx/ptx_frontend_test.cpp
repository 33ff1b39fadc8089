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
      {"tex.a2dms.v4.f32.s32",
       ".reg .f32 %f<5>; .reg .b32 %r<2>; .reg .b64 %rd<2>;\n"
       "tex.a2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r1, %r1, %r1}];"},
      {"mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32",
       ".reg .b32 %r<8>;\n"
       "mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32 {%r0, %r1, %r2, %r3}, {%r4, %r5}, "
       "{%r6}, {%r0, %r1, %r2, %r3};"},
      {"mbarrier.expect_tx.relaxed.cta.shared.b64",
       ".reg .b32 %r<2>;\n"
       "mbarrier.expect_tx.relaxed.cta.shared.b64 [%r1], 256;"},
      {"ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8",
       ".reg .b32 %r<3>;\n"
       "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%r1, %r2}, [%r2];"},
      {"suld.b.2dms.b32.trap",
       ".reg .b32 %r<3>; .reg .b64 %rd<2>;\n"
       "suld.b.2dms.b32.trap {%r1}, [%rd1, {%r2, %r1}];"},
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

// Every class of PTX the interpreter does not execute, as nvcc writes it: each is refused at load
// with NOT_SUPPORTED (never INVALID_PTX, never a load that would run with a wrong answer), and the
// message names the instruction (or special register) and the kernel, as the daemon logs it.
TEST(PtxFrontend, EveryUnsupportedClassIsRefusedByName) {
  const char* const kRegisters =
      ".reg .pred %p<3>; .reg .b16 %rs<5>; .reg .b32 %r<9>; .reg .f32 %f<9>; .reg .b64 %rd<5>;\n";
  struct Case {
    const char* named;  // what the message must name
    const char* why;    // and the reason it gives
    const char* body;
  };
  const Case cases[] = {
      // Textures and surfaces.
      {"tex.a2dms.v4.f32.s32", "multi-sample textures",
       "tex.a2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r5, %r6, %r7, %r7}];"},
      {"tld4.r.acube.v4.f32.f32", "tld4 of a cube map",
       "tld4.r.acube.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%r5, %f5, %f6, %f6}];"},
      {"tex.2d.v4.f32.f32", "texture residency predicates (sparse)",
       "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}|%p1, [%rd1, {%f5, %f6}];"},
      {"txq.level.width.b32", "txq of a mip level", "txq.level.width.b32 %r1, [%rd1], %r2;"},
      {"suld.b.2dms.v4.b32.trap", "multi-sample",
       "suld.b.2dms.v4.b32.trap {%r1, %r2, %r3, %r4}, [%rd1, {%r7, %r5}];"},
      {"sust.p.1d.b32.clamp", "formatted surface stores",
       "sust.p.1d.b32.clamp [%rd1, {%r5}], {%r1};"},
      {"sured.b.add.1d.u32.trap", "surface reductions",
       "sured.b.add.1d.u32.trap [%rd1, {%r5}], %r1;"},
      {"suq.channel_order.b32", "suq of that attribute", "suq.channel_order.b32 %r1, [%rd1];"},
      // Tensor cores.
      // mma of sub-byte and fp8 types, sparse mma and Volta's m8n8k4 .f16 (mma.sync of the
      // other shapes and types is executed).
      {"mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32", "tensor-core instructions",
       "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%r1, %r2, %r3, %r4}, "
       "{%r5, %r6, %r7, %r8}, {%r5, %r6}, {%r1, %r2, %r3, %r4};"},
      {"mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "tensor-core instructions",
       "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1, %f2, %f3, %f4}, "
       "{%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};"},
      {"mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32", "tensor-core instructions",
       "mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, "
       "{%r1, %r2, %r3, %r4}, {%r5, %r6, %r7, %r8}, {%f5, %f6, %f7, %f8}, %r1, 0x0;"},
      {"mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32", "tensor-core instructions",
       "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4, %f5, %f6, %f7, "
       "%f8}, {%r1, %r2}, {%r3, %r4}, {%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8};"},
      // wmma of sub-byte types (the experimental s4, u4 and b1 fragments).
      {"wmma.load.a.sync.aligned.row.m8n8k32.s4", "tensor-core instructions",
       "wmma.load.a.sync.aligned.row.m8n8k32.s4 {%r1}, [%rd1], %r2;"},
      {"wmma.mma.sync.aligned.row.col.m8n8k32.s32.s4.s4.s32", "tensor-core instructions",
       "wmma.mma.sync.aligned.row.col.m8n8k32.s32.s4.s4.s32 {%r1, %r2}, {%r3}, {%r4}, {%r5, %r6};"},
      {"wgmma.fence.sync.aligned", "tensor-core instructions", "wgmma.fence.sync.aligned;"},
      {"wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", "tensor-core instructions",
       "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, 1, "
       "1, 1, 0, 0;"},
      {"ldmatrix.sync.aligned.m16n16.x2.trans.shared.b8", "8 x 8 matrices of .b16",
       "ldmatrix.sync.aligned.m16n16.x2.trans.shared.b8 {%r1, %r2, %r3, %r4}, [%r5];"},
      {"stmatrix.sync.aligned.m16n8.x1.trans.shared.b8", "8 x 8 matrices of .b16",
       "stmatrix.sync.aligned.m16n8.x1.trans.shared.b8 [%r5], {%r1};"},
      // TMA and the barriers it completes on.
      {"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", "TMA",
       "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1], 256, "
       "[%r2];"},
      {"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes", "TMA",
       "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r1], "
       "[%rd1, {%r3, %r4}], [%r2];"},
      {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32", "TMA",
       "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%rd1], [%r1], 256;"},
      {"cp.async.bulk.commit_group", "TMA", "cp.async.bulk.commit_group;"},
      {"mbarrier.complete_tx.shared::cta.b64", "mbarrier",
       "mbarrier.complete_tx.shared::cta.b64 [%r1], 32;"},
      {"mbarrier.arrive.shared::cluster.b64", "thread-block clusters",
       "mbarrier.arrive.shared::cluster.b64 _, [%r1];"},
      {"mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier",
       "mbarrier.arrive.expect_tx.shared::cta.b64 %rd1, [%r1], 256;"},
      {"tensormap.replace.tile.global_address.global.b1024.b64", "TMA",
       "tensormap.replace.tile.global_address.global.b1024.b64 [%rd1], %rd2;"},
      // Clusters.
      {"%clusterid.x", "thread-block clusters", "mov.u32 %r1, %clusterid.x;"},
      {"%nclusterid.x", "thread-block clusters", "mov.u32 %r1, %nclusterid.x;"},
      {"%cluster_ctaid.y", "thread-block clusters", "mov.u32 %r1, %cluster_ctaid.y;"},
      {"%cluster_nctaid.x", "thread-block clusters", "mov.u32 %r1, %cluster_nctaid.x;"},
      {"%cluster_ctarank", "thread-block clusters", "mov.u32 %r1, %cluster_ctarank;"},
      {"%cluster_nctarank", "thread-block clusters", "mov.u32 %r1, %cluster_nctarank;"},
      {"%is_explicit_cluster", "thread-block clusters", "mov.pred %p1, %is_explicit_cluster;"},
      {"barrier.cluster.arrive", "thread-block clusters", "barrier.cluster.arrive;"},
      {"barrier.cluster.arrive.relaxed.aligned", "thread-block clusters",
       "barrier.cluster.arrive.relaxed.aligned;"},
      {"barrier.cluster.wait", "thread-block clusters", "barrier.cluster.wait;"},
      {"mapa.shared::cluster.u32", "thread-block clusters",
       "mapa.shared::cluster.u32 %r1, %r2, %r3;"},
      {"getctarank.shared::cluster.u32", "thread-block clusters",
       "getctarank.shared::cluster.u32 %r1, %r2;"},
      {"ld.shared::cluster.u32", "thread-block clusters", "ld.shared::cluster.u32 %r1, [%r2];"},
      {"st.async.shared::cluster.mbarrier::complete_tx::bytes.u32", "thread-block clusters",
       "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%r1], %r2, [%r3];"},
      // Anything else the interpreter does not know.
      {"multimem.ld_reduce.relaxed.sys.global.add.u32", "multimem",
       "multimem.ld_reduce.relaxed.sys.global.add.u32 %r1, [%rd1];"},
      {"setmaxnreg.inc.sync.aligned.u32", "does not know", "setmaxnreg.inc.sync.aligned.u32 240;"},
      {"stacksave.u64", "does not know", "stacksave.u64 %rd1;"},
      {"bmma.sync.aligned.m8n8k128.row.col.and.popc.s32.b1.b1.s32", "tensor-core instructions",
       "bmma.sync.aligned.m8n8k128.row.col.and.popc.s32.b1.b1.s32 {%r1, %r2}, {%r3}, {%r4}, "
       "{%r5, %r6};"},
      {"frobnicate.b32", "does not know", "frobnicate.b32 %r1, %r2;"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.named);
    const DecodeResult result =
        decode(kernel("uses_it", std::string(kRegisters) + "mov.u32 %r1, 0;\n" + c.body));
    EXPECT_EQ(result.status, CUDA_ERROR_NOT_SUPPORTED) << result.message;
    EXPECT_EQ(result.program, nullptr);
    EXPECT_NE(result.message.find(c.named), std::string::npos) << result.message;
    EXPECT_NE(result.message.find(c.why), std::string::npos) << result.message;
    EXPECT_NE(result.message.find("kernel 'uses_it'"), std::string::npos) << result.message;
  }
}

// The first unsupported instruction is the one named, and a device function is named as such.
TEST(PtxFrontend, TheFirstUnsupportedInstructionIsNamed) {
  const DecodeResult first = decode(
      kernel("k",
             ".reg .b32 %r<4>; .reg .b64 %rd<2>;\n"
             "mbarrier.expect_tx.shared.b64 [%r1], 4;\nldmatrix.sync.aligned.m8n8.x1.shared.b16 "
             "{%r1}, [%r2];"));
  EXPECT_EQ(first.status, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(first.message.find("mbarrier.expect_tx.shared.b64"), std::string::npos)
      << first.message;
  EXPECT_EQ(first.message.find("ldmatrix"), std::string::npos) << first.message;
  EXPECT_NE(first.message.find("line 7"), std::string::npos) << first.message;
  const DecodeResult inFunction = decode(
      ".func helper() { .reg .b32 %r<2>; mov.u32 %r1, %clusterid.x; ret; }\n"
      ".visible .entry k() { call.uni helper, (); ret; }\n");
  EXPECT_EQ(inFunction.status, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_NE(inFunction.message.find("function 'helper'"), std::string::npos) << inFunction.message;
  EXPECT_NE(inFunction.message.find("%clusterid.x"), std::string::npos) << inFunction.message;
}

// A module loads when any of its kernels can run: a kernel the interpreter cannot run, or one
// calling a function it cannot run, keeps its declaration and the reason, and loses its code.
TEST(PtxFrontend, AModuleLoadsWhenAnyOfItsKernelsCanRun) {
  const DecodeResult mixed = decode(
      ".func helper() { .reg .b32 %r<2>; mov.u32 %r1, %clusterid.x; ret; }\n"
      ".visible .entry calls_it() { call.uni helper, (); ret; }\n" +
      kernel("tma", ".reg .b32 %r<2>;\nmbarrier.expect_tx.relaxed.cta.shared.b64 [%r1], 256;") +
      kernel("fine", ""));
  ASSERT_TRUE(mixed.ok()) << mixed.message;
  auto named = [&](const std::string& name) -> const Function* {
    for (const Function& function : mixed.program->functions) {
      if (function.name == name) return &function;
    }
    return nullptr;
  };
  ASSERT_NE(named("fine"), nullptr);
  EXPECT_TRUE(named("fine")->unsupported.empty());
  EXPECT_FALSE(named("fine")->code.empty());
  ASSERT_NE(named("tma"), nullptr);
  EXPECT_NE(named("tma")->unsupported.find("mbarrier.expect_tx"), std::string::npos);
  EXPECT_TRUE(named("tma")->code.empty());
  EXPECT_EQ(named("tma")->kernelParameters.size(), 1u);
  ASSERT_NE(named("calls_it"), nullptr);
  EXPECT_NE(named("calls_it")->unsupported.find("'helper'"), std::string::npos);
  EXPECT_NE(named("calls_it")->unsupported.find("%clusterid.x"), std::string::npos);
  // A function that cannot run but whose address a kernel takes could be called indirectly from
  // any kernel: then the module is refused as a whole.
  const DecodeResult pointedTo =
      decode(".func helper() { .reg .b32 %r<2>; mov.u32 %r1, %clusterid.x; ret; }\n" +
             kernel("takes_it", ".reg .b64 %rd<2>;\nmov.u64 %rd1, helper;") + kernel("fine", ""));
  EXPECT_EQ(pointedTo.status, CUDA_ERROR_NOT_SUPPORTED) << pointedTo.message;
  EXPECT_NE(pointedTo.message.find("'helper'"), std::string::npos) << pointedTo.message;
}

// Texture, surface and sampler references, unified variables and cluster launches are refused
// where they are declared.
TEST(PtxFrontend, UnsupportedDeclarationsAreRefusedByName) {
  const std::pair<std::string, std::string> cases[] = {
      {".global .texref tex;\n" + kernel("k", ""), ".texref"},
      {".global .surfref surf;\n" + kernel("k", ""), ".surfref"},
      {".global .samplerref sampler;\n" + kernel("k", ""), ".samplerref"},
      {".global .attribute(.unified(1, 2)) .align 4 .u32 m;\n" + kernel("k", ""), ".unified"},
      {".visible .entry k() .reqnctapercluster 2, 1, 1 { ret; }", ".reqnctapercluster"},
      {".visible .entry k() .explicitcluster { ret; }", ".explicitcluster"},
      {".visible .entry k() .maxclusterrank 8 { ret; }", ".maxclusterrank"},
  };
  for (const auto& [text, named] : cases) {
    SCOPED_TRACE(named);
    const DecodeResult result = decode(text);
    EXPECT_EQ(result.status, CUDA_ERROR_NOT_SUPPORTED) << result.message;
    EXPECT_NE(result.message.find(named), std::string::npos) << result.message;
  }
}

// __managed__ variables decode as variables the host will share (placed later by their client).
TEST(PtxFrontend, ManagedVariablesAreMarked) {
  const DecodeResult result = decode(
      ".global .attribute(.managed) .align 4 .u32 m = 5;\n.global .u32 plain;\n" + kernel("k", ""));
  ASSERT_EQ(result.status, CUDA_SUCCESS) << result.message;
  ASSERT_EQ(result.program->variables.size(), 2u);
  EXPECT_TRUE(result.program->variables[0].managed);
  EXPECT_EQ(result.program->variables[0].bytes, 4u);
  EXPECT_FALSE(result.program->variables[1].managed);
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
