#include "server/backend/ptx/ptx_parser.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace gpuproxy::server::ptx {
namespace {

constexpr const char kHeader[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n";

PtxEntry parseOne(const std::string& body) {
  const PtxParseResult result = parsePtx(kHeader + body);
  EXPECT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.module.entries.size(), 1u);
  return result.module.entries.empty() ? PtxEntry{} : result.module.entries.front();
}

struct Expected {
  std::uint32_t offset;
  std::uint32_t size;
  std::uint32_t alignment;
};

void expectLayout(const PtxEntry& entry, const std::vector<Expected>& expected,
                  std::uint32_t totalBytes) {
  ASSERT_EQ(entry.parameters.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(entry.parameters[i].offset, expected[i].offset) << "parameter " << i;
    EXPECT_EQ(entry.parameters[i].size, expected[i].size) << "parameter " << i;
    EXPECT_EQ(entry.parameters[i].alignment, expected[i].alignment) << "parameter " << i;
  }
  EXPECT_EQ(entry.parameterBytes, totalBytes);
}

TEST(PtxParser, VectorAddAsNvccEmitsIt) {
  const PtxEntry entry = parseOne(R"(
	// .globl	vector_add
.visible .entry vector_add(
	.param .u64 vector_add_param_0,
	.param .u64 vector_add_param_1,
	.param .u64 vector_add_param_2,
	.param .u32 vector_add_param_3
)
{
	.reg .b64 	%rd<11>;
	ld.param.u64 	%rd1, [vector_add_param_0];
	ret;
}
)");
  EXPECT_EQ(entry.name, "vector_add");
  EXPECT_EQ(entry.parameters[3].name, "vector_add_param_3");
  expectLayout(entry, {{0, 8, 8}, {8, 8, 8}, {16, 8, 8}, {24, 4, 4}}, 28);
}

TEST(PtxParser, ScalarsAreNaturallyAlignedWithPadding) {
  // char, double, short, float, u64: every parameter after the first needs padding.
  const PtxEntry entry = parseOne(R"(
.visible .entry k(.param .u8 a, .param .f64 b, .param .u16 c, .param .f32 d, .param .b64 e,
                  .param .s32 f, .param .s8 g, .param .b16 h)
{ ret; }
)");
  expectLayout(entry,
               {{0, 1, 1},
                {8, 8, 8},
                {16, 2, 2},
                {20, 4, 4},
                {24, 8, 8},
                {32, 4, 4},
                {36, 1, 1},
                {38, 2, 2}},
               40);
}

TEST(PtxParser, StructParametersUseTheirExplicitAlignment) {
  const PtxEntry entry = parseOne(R"(
.visible .entry s(
	.param .u8 s_param_0,
	.param .align 8 .b8 s_param_1[16],
	.param .u8 s_param_2,
	.param .align 16 .b8 s_param_3[32],
	.param .b8 s_param_4[3],
	.param .align 4 .b8 s_param_5[12]
)
{ ret; }
)");
  expectLayout(entry, {{0, 1, 1}, {8, 16, 8}, {24, 1, 1}, {32, 32, 16}, {64, 3, 1}, {68, 12, 4}},
               80);
}

TEST(PtxParser, PointerQualifiersDoNotChangeTheLayout) {
  // After .ptr, .align is the pointee's alignment, not the parameter's.
  const PtxEntry entry = parseOne(R"(
.visible .entry p(.param .u32 n, .param .u64 .ptr .global .align 4 data,
                  .param .u64 .ptr .align 16 other)
{ ret; }
)");
  expectLayout(entry, {{0, 4, 4}, {8, 8, 8}, {16, 8, 8}}, 24);
}

TEST(PtxParser, ManyParameters) {
  std::string declaration = ".visible .entry many(";
  for (int i = 0; i < 40; ++i) {
    if (i != 0) declaration += ",\n";
    declaration += (i % 2 == 0 ? ".param .u32 p" : ".param .u64 p") + std::to_string(i);
  }
  declaration += ")\n{ ret; }\n";
  const PtxEntry entry = parseOne(declaration);
  ASSERT_EQ(entry.parameters.size(), 40u);
  // Pairs of (u32 at 16k, u64 at 16k + 8).
  for (std::uint32_t i = 0; i < 40; ++i) {
    EXPECT_EQ(entry.parameters[i].offset, (i / 2) * 16 + (i % 2) * 8) << i;
  }
  EXPECT_EQ(entry.parameterBytes, 20u * 16);
}

TEST(PtxParser, NoParameters) {
  EXPECT_EQ(parseOne(".visible .entry trap()\n{\n\tret;\n}\n").parameterBytes, 0u);
  EXPECT_TRUE(parseOne(".entry bare\n{\n\tret;\n}\n").parameters.empty());
}

TEST(PtxParser, CommentsAreIgnored) {
  const PtxEntry entry = parseOne(R"(
// .visible .entry commented_out(.param .u64 x) { }
/* .entry also_not(.param .u8 y)
   { } */
.visible .entry real( // trailing comment
	.param .u32 a, /* inline */ .param .u64 b
)
{ ret; }
)");
  EXPECT_EQ(entry.name, "real");
  expectLayout(entry, {{0, 4, 4}, {8, 8, 8}}, 16);
}

TEST(PtxParser, MultipleEntriesWithFunctionsAndDirectives) {
  const PtxParseResult result = parsePtx(std::string(kHeader) + R"(
.extern .func (.param .b32 retval) vprintf(.param .b64 fmt, .param .b64 args);
.global .align 4 .b8 table[16] = {1, 2, 3, 4};
.func (.param .b32 r) helper(.param .b32 x) { ret; }
.extern .entry elsewhere(.param .u64 a);
.weak .entry first(.param .f32 a) .maxntid 128, 1, 1 .minnctapersm 2 { { ret; } }
.visible .entry second(.param .f64 a, .param .u16 b) { $L__BB0_1: ret; }
)");
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.module.entries.size(), 2u);
  EXPECT_EQ(result.module.entries[0].name, "first");
  EXPECT_EQ(result.module.entries[0].parameterBytes, 4u);
  EXPECT_EQ(result.module.entries[1].name, "second");
  EXPECT_EQ(result.module.entries[1].parameterBytes, 10u);
}

TEST(PtxParser, StopsAtNul) {
  std::string text = std::string(kHeader) + ".entry a() { ret; }";
  text.push_back('\0');
  text += ".entry b() { ret; }";
  const PtxParseResult result = parsePtx(text);
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.module.entries.size(), 1u);
  EXPECT_EQ(result.module.entries[0].name, "a");
}

TEST(PtxParser, RejectsMalformedInput) {
  const char* const kBad[] = {
      ".entry",                                            // no name
      ".entry k(",                                         // unterminated list
      ".entry k(.param .u64 a",                            // unterminated list
      ".entry k(.param .u64 a) {",                         // unterminated body
      ".entry k(.param .u64 a)",                           // no body
      ".entry k(.param a) { }",                            // no type
      ".entry k(.param .u64 .u32 a) { }",                  // two types
      ".entry k(.param .quux a) { }",                      // unknown type
      ".entry k(.param .u64 a,) { }",                      // dangling comma
      ".entry k(.param .u64 a .param .u64 b) { }",         // missing comma
      ".entry k(.param .align 3 .b8 a[4]) { }",            // alignment not a power of two
      ".entry k(.param .align 8 .b8 a[]) { }",             // no array length
      ".entry k(.param .b8 a[0]) { }",                     // empty array
      ".entry k(.param .b8 a[99999999999999999999]) { }",  // absurd length
      ".entry k(.param .b8 a[40000]) { }",                 // beyond the driver's parameter limit
      ".entry k(.param .u64 a, .param .u64 a) { }",        // duplicate parameter
      ".entry k() { } .entry k() { }",                     // duplicate entry
      ".entry k() { } }",                                  // unbalanced brace
      "/* unterminated comment .entry k() { }",
      ".file 1 \"unterminated string",
      ".entry 9k() { }",  // not an identifier
  };
  for (const char* bad : kBad) {
    const PtxParseResult result = parsePtx(std::string(kHeader) + bad);
    EXPECT_FALSE(result.ok()) << bad;
    EXPECT_TRUE(result.module.entries.empty()) << bad;
  }
}

TEST(PtxParser, GarbageNeverCrashes) {
  // Deterministic pseudo-random byte soup built from PTX fragments and raw bytes.
  const char* const kFragments[] = {".entry", ".param", ".u64", ".align", "8",    "[",   "]",  "(",
                                    ")",      ",",      "{",    "}",      "//",   "/*",  "*/", "\"",
                                    "name",   ".b8",    ".ptr", "\n",     "\x01", "\xff"};
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 2000; ++round) {
    std::string text = kHeader;
    for (int i = 0; i < 40; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += kFragments[(state >> 33) % std::size(kFragments)];
      text += ' ';
    }
    const PtxParseResult result = parsePtx(text);
    if (!result.ok()) {
      EXPECT_TRUE(result.module.entries.empty());
    }
  }
}

TEST(PtxParser, LooksLikePtx) {
  const auto bytes = [](std::string_view text) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size());
  };
  EXPECT_TRUE(looksLikePtx(bytes(kHeader)));
  EXPECT_FALSE(looksLikePtx(bytes(".version 8.0\n")));
  EXPECT_FALSE(
      looksLikePtx(bytes("\x7f"
                         "ELF\x02\x01\x01")));
  EXPECT_FALSE(looksLikePtx(bytes("")));
  // Text after a NUL is not part of the image.
  const std::string split = std::string(".version 8.0\n") + '\0' + ".target sm_90\n";
  EXPECT_FALSE(looksLikePtx(bytes(split)));
}

}  // namespace
}  // namespace gpuproxy::server::ptx
