// The PTX conformance suite's host side: runs every kernel of tests/programs/kernels/
// conformance.cu on edge-case and random inputs and compares each result with a CPU reference
// written here from the PTX ISA's definitions. An ordinary driver-API program: run it on a GPU
// with the real libcuda.so.1, or through the stub on the sim.
//
//   ptx_conformance [--debug] [--verbose]
//
// --debug runs the PTX nvcc emits with -G. Prints one line per class and "PASSED: N results" or
// the first mismatches and exit code 1.

#include <cuda.h>
#include <cuda_fp8.h>

#include "conformance_debug_ptx.hpp"
#include "conformance_ptx.hpp"
#include "conformance_sm90_debug_ptx.hpp"
#include "conformance_sm90_ptx.hpp"

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kSlots = 64;
constexpr std::uint64_t kUnset = 0xdeadbeefcafef00dull;

struct In {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::uint64_t c = 0;
};

[[noreturn]] void fail(const char* call, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "ptx_conformance: %s failed: %s (%d)\n", call, name,
               static_cast<int>(result));
  std::exit(1);
}

#define CHECK(call)                                    \
  do {                                                 \
    CUresult result_ = (call);                         \
    if (result_ != CUDA_SUCCESS) fail(#call, result_); \
  } while (0)

// ---- How a slot is compared ------------------------------------------------------------------

enum class Compare { kSkip, kExact, kF32, kF64, kF32Ulp, kF64Ulp, kF32Rel, kHalfUlp };

struct Expect {
  Compare how = Compare::kSkip;
  std::uint64_t value = 0;
  double tolerance = 0;  // ulp or relative error
};

float f32(std::uint64_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
}
double f64(std::uint64_t bits) {
  return std::bit_cast<double>(bits);
}
std::uint64_t bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}
std::uint64_t bits(double value) {
  return std::bit_cast<std::uint64_t>(value);
}

Expect exact(std::uint64_t value) {
  return {Compare::kExact, value, 0};
}
Expect same(float value) {
  return {Compare::kF32, bits(value), 0};
}
Expect same(double value) {
  return {Compare::kF64, bits(value), 0};
}
Expect ulps(float value, double tolerance) {
  return {Compare::kF32Ulp, bits(value), tolerance};
}
Expect ulps(double value, double tolerance) {
  return {Compare::kF64Ulp, bits(value), tolerance};
}
Expect relative(float value, double tolerance) {
  return {Compare::kF32Rel, bits(value), tolerance};
}

std::int64_t orderedF32(std::uint32_t value) {
  return (value & 0x80000000u) != 0 ? -static_cast<std::int64_t>(value & 0x7fffffffu)
                                    : static_cast<std::int64_t>(value);
}
std::int64_t orderedF64(std::uint64_t value) {
  return (value >> 63) != 0 ? -static_cast<std::int64_t>(value & 0x7fffffffffffffffull)
                            : static_cast<std::int64_t>(value);
}

bool matches(const Expect& expect, std::uint64_t got) {
  switch (expect.how) {
    case Compare::kSkip:
      return true;
    case Compare::kExact:
      return got == expect.value;
    case Compare::kF32: {
      const float want = f32(expect.value);
      const float have = f32(got);
      if (std::isnan(want)) return std::isnan(have);
      return (got & 0xffffffffull) == expect.value;
    }
    case Compare::kF64: {
      if (std::isnan(f64(expect.value))) return std::isnan(f64(got));
      return got == expect.value;
    }
    case Compare::kF32Ulp: {
      const float want = f32(expect.value);
      const float have = f32(got);
      if (std::isnan(want) || std::isnan(have)) return std::isnan(want) && std::isnan(have);
      if (std::isinf(want) || std::isinf(have)) return want == have;
      return std::abs(orderedF32(static_cast<std::uint32_t>(got)) -
                      orderedF32(static_cast<std::uint32_t>(expect.value))) <= expect.tolerance;
    }
    case Compare::kF64Ulp: {
      const double want = f64(expect.value);
      const double have = f64(got);
      if (std::isnan(want) || std::isnan(have)) return std::isnan(want) && std::isnan(have);
      if (std::isinf(want) || std::isinf(have)) return want == have;
      return std::abs(orderedF64(got) - orderedF64(expect.value)) <= expect.tolerance;
    }
    case Compare::kF32Rel: {
      const double want = f32(expect.value);
      const double have = f32(got);
      if (std::isnan(want) || std::isnan(have)) return std::isnan(want) && std::isnan(have);
      if (std::isinf(want) || std::isinf(have)) return want == have;
      return std::abs(have - want) <= expect.tolerance * std::max(1.0, std::abs(want));
    }
    case Compare::kHalfUlp: {
      const auto want = static_cast<std::int32_t>(expect.value & 0xffff);
      const auto have = static_cast<std::int32_t>(got & 0xffff);
      return std::abs(want - have) <= expect.tolerance;
    }
  }
  return false;
}

// ---- Float helpers with a rounding mode --------------------------------------------------------

// The result goes through a volatile so that the compiler computes it before the rounding mode
// is restored (it may otherwise sink arithmetic on registers past the call).
template <typename Op>
auto withRounding(int mode, Op op) {
  const int saved = std::fegetround();
  std::fesetround(mode);
  volatile auto result = op();
  std::fesetround(saved);
  return static_cast<decltype(op())>(result);
}

float flush(float value) {
  return std::fpclassify(value) == FP_SUBNORMAL ? std::copysign(0.0f, value) : value;
}
float saturate(float value) {
  if (std::isnan(value)) return 0.0f;
  if (value <= 0.0f) return 0.0f;
  return value > 1.0f ? 1.0f : value;
}
template <typename F>
F gpuMin(F a, F b, bool nanPropagates = false) {
  if (std::isnan(a) || std::isnan(b)) {
    if (nanPropagates || (std::isnan(a) && std::isnan(b)))
      return std::numeric_limits<F>::quiet_NaN();
    return std::isnan(a) ? b : a;
  }
  if (a == 0 && b == 0) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
template <typename F>
F gpuMax(F a, F b) {
  if (std::isnan(a) || std::isnan(b)) {
    if (std::isnan(a) && std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
    return std::isnan(a) ? b : a;
  }
  if (a == 0 && b == 0) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// Float to integer as cvt does: rounded, saturated, NaN to 0.
template <typename I>
I toInt(double value, int mode) {
  if (std::isnan(value)) return 0;
  double rounded = 0;
  switch (mode) {
    case FE_TONEAREST:
      rounded = std::nearbyint(value);
      break;
    case FE_DOWNWARD:
      rounded = std::floor(value);
      break;
    case FE_UPWARD:
      rounded = std::ceil(value);
      break;
    default:
      rounded = std::trunc(value);
      break;
  }
  const long double wide = rounded;
  if (wide <= static_cast<long double>(std::numeric_limits<I>::min())) {
    return std::numeric_limits<I>::min();
  }
  if (wide >= static_cast<long double>(std::numeric_limits<I>::max())) {
    return std::numeric_limits<I>::max();
  }
  return static_cast<I>(rounded);
}

// IEEE half through the compiler's own _Float16 (round to nearest even); directed rounding by
// stepping the nearest result toward the right side.
std::uint16_t halfBits(_Float16 value) {
  return std::bit_cast<std::uint16_t>(value);
}
_Float16 halfOf(std::uint16_t bits) {
  return std::bit_cast<_Float16>(bits);
}
std::uint16_t toHalf(double value, int mode = FE_TONEAREST) {
  if (std::isnan(value)) return 0x7fff;
  std::uint16_t h = halfBits(static_cast<_Float16>(value));
  const double back = static_cast<double>(halfOf(h));
  auto down = [&]() {  // toward -inf
    if (h == 0x0000) return std::uint16_t{0x8001};
    return static_cast<std::uint16_t>((h & 0x8000) != 0 ? h + 1 : h - 1);
  };
  auto up = [&]() {  // toward +inf
    if (h == 0x8000) return std::uint16_t{0x0001};
    return static_cast<std::uint16_t>((h & 0x8000) != 0 ? h - 1 : h + 1);
  };
  if (mode == FE_TOWARDZERO && std::abs(back) > std::abs(value)) {
    h = static_cast<std::uint16_t>(h - 1);  // magnitude one step down (same sign)
  } else if (mode == FE_DOWNWARD && back > value) {
    h = down();
  } else if (mode == FE_UPWARD && back < value) {
    h = up();
  }
  return h;
}
double fromHalf(std::uint16_t bits) {
  return static_cast<double>(halfOf(bits));
}

std::uint16_t toBf16(float value, bool truncate) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return 0x7fff;
  if (truncate) return static_cast<std::uint16_t>(x >> 16);
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1);
  return static_cast<std::uint16_t>(rounded >> 16);
}
float fromBf16(std::uint16_t bits) {
  return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

// ---- Inputs ----------------------------------------------------------------------------------

std::vector<std::uint32_t> intEdges() {
  return {0u,          1u,          0xffffffffu, 2u,      0x80000000u, 0x7fffffffu,
          0x80000001u, 0x80u,       0xffu,       0x7fffu, 0x8000u,     31u,
          32u,         33u,         63u,         64u,     100u,        0xffffff9cu,
          0x12345678u, 0xdeadbeefu, 0x00ff00ffu, 0x3u};
}

// Words whose bytes and half-words sit at the lanes' limits (0, 0x7f/0x80, 0xff, 0x7fff/0x8000).
std::vector<std::uint32_t> simdEdges() {
  return {0u,          0xffffffffu, 0x80808080u, 0x7f7f7f7fu, 0x7fff8000u, 0x80007fffu,
          0x01ff7f80u, 0xff017f80u, 0x00ff00ffu, 0xff00ff00u, 0x12345678u, 0xdeadbeefu,
          0x80000001u, 0x7fffffffu, 0x0001fffeu, 0x807f01feu};
}

std::vector<std::uint32_t> floatEdges() {
  return {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u, 0xff800000u,
          0x7fc00000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x3f000000u,
          0x3fc00000u, 0x40200000u, 0xc0200000u, 0x40400000u, 0x501502f9u, 0x2edbe6ffu,
          0x40490fdbu, 0x4b800001u, 0x3dcccccdu, 0x3eaaaaabu, 0xc2c80000u, 0x4effffffu};
}

std::vector<std::uint64_t> doubleEdges() {
  return {0x0000000000000000ull, 0x8000000000000000ull, 0x3ff0000000000000ull,
          0xbff0000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
          0x7ff8000000000000ull, 0x0000000000000001ull, 0x000fffffffffffffull,
          0x0010000000000000ull, 0x7fefffffffffffffull, 0x3fe0000000000000ull,
          0x4004000000000000ull, 0xc004000000000000ull, 0x400921fb54442d18ull,
          0x3fb999999999999aull, 0x4340000000000001ull, 0x41e0000000000000ull,
          0xc1e0000000200000ull, 0x37a16c262777579cull, 0x47efffffe0000000ull};
}

// Pairs of edge values (all of them), then random rows; c cycles through the edges.
template <typename T>
std::vector<In> pairs(const std::vector<T>& edges, std::mt19937_64& random, std::size_t extra,
                      std::uint64_t randomMask) {
  std::vector<In> rows;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    for (std::size_t j = 0; j < edges.size(); ++j) {
      rows.push_back(In{edges[i], edges[j], edges[(i + 2 * j + 1) % edges.size()]});
    }
  }
  for (std::size_t k = 0; k < extra; ++k) {
    rows.push_back(In{random() & randomMask, random() & randomMask, random() & randomMask});
  }
  return rows;
}

// ---- The references ------------------------------------------------------------------------

using Reference = std::function<void(const std::vector<In>& in, std::size_t i, Expect* out)>;

std::uint32_t bfe32(std::uint32_t a, std::uint32_t pos, std::uint32_t len, bool isSigned) {
  pos &= 0xff;
  len &= 0xff;
  bool sign = false;
  if (isSigned && len != 0) sign = (a >> std::min(pos + len - 1, 31u)) & 1;
  std::uint32_t d = 0;
  for (std::uint32_t k = 0; k < 32; ++k) {
    const bool bit = (k < len && pos + k <= 31) ? ((a >> (pos + k)) & 1) : sign;
    d |= static_cast<std::uint32_t>(bit) << k;
  }
  return d;
}

std::uint32_t prmtMode(std::uint32_t a, std::uint32_t b, std::uint32_t c, int mode) {
  const std::uint64_t bytes = (std::uint64_t{b} << 32) | a;
  const std::uint32_t s = c & 3;
  std::uint32_t picks[4];
  for (std::uint32_t k = 0; k < 4; ++k) {
    if (mode == 0) picks[k] = (s + k) & 7;            // f4e
    if (mode == 1) picks[k] = std::max(k, s);         // ecl
    if (mode == 2) picks[k] = (s & 1) * 2 + (k & 1);  // rc16
  }
  std::uint32_t d = 0;
  for (std::uint32_t k = 0; k < 4; ++k) d |= ((bytes >> (8 * picks[k])) & 0xff) << (8 * k);
  return d;
}

void int32Reference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const auto ua = static_cast<std::uint32_t>(in[i].a);
  const auto ub = static_cast<std::uint32_t>(in[i].b);
  const auto uc = static_cast<std::uint32_t>(in[i].c);
  const auto a = static_cast<std::int32_t>(ua);
  const auto b = static_cast<std::int32_t>(ub);
  const auto c = static_cast<std::int32_t>(uc);
  auto u32 = [](std::int64_t value) { return exact(static_cast<std::uint32_t>(value)); };
  out[0] = exact(std::uint32_t(ua + ub));
  out[1] = exact(std::uint32_t(ua - ub));
  out[2] = exact(std::uint32_t(ua * ub));
  out[3] = u32((std::int64_t{a} * b) >> 32);
  out[4] = exact(static_cast<std::uint32_t>((std::uint64_t{ua} * ub) >> 32));
  if (b != 0) {
    // INT_MIN / -1 wraps to INT_MIN on a GPU; its remainder is 0.
    out[5] = u32(a == INT32_MIN && b == -1 ? INT32_MIN : a / b);
    out[6] = u32(b == -1 ? 0 : a % b);
    out[7] = exact(ua / ub);
    out[8] = exact(ua % ub);
  }
  out[9] = u32(std::min(a, b));
  out[10] = u32(std::max(a, b));
  out[11] = exact(std::min(ua, ub));
  out[12] = exact(std::max(ua, ub));
  out[13] = u32(a == INT32_MIN ? a : std::abs(a));
  out[14] = exact(0u - ua);
  out[15] = exact(~ua);
  out[16] = exact(ua & ub);
  out[17] = exact(ua | ub);
  out[18] = exact(ua ^ ub);
  out[19] = exact(ua << (ub & 31));
  // Shifts by the register width or more: 0, or all sign bits.
  out[20] = exact(ub >= 32 ? 0u : ua << ub);
  out[21] = exact(ub >= 32 ? 0u : ua >> ub);
  out[22] = u32(ub >= 32 ? (a < 0 ? -1 : 0) : a >> ub);
  out[23] = exact(static_cast<std::uint32_t>(std::popcount(ua)));
  out[24] = exact(static_cast<std::uint32_t>(std::countl_zero(ua)));
  out[25] = exact(ua == 0 ? 0u : static_cast<std::uint32_t>(std::countr_zero(ua)) + 1);
  std::uint32_t reversed = 0;
  for (int k = 0; k < 32; ++k) reversed |= ((ua >> k) & 1) << (31 - k);
  out[26] = exact(reversed);
  {
    const std::uint64_t bytes = (std::uint64_t{ub} << 32) | ua;
    std::uint32_t d = 0;
    for (int k = 0; k < 4; ++k) d |= ((bytes >> (8 * ((uc >> (4 * k)) & 7))) & 0xff) << (8 * k);
    out[27] = exact(d);
  }
  const std::uint64_t funnel = (std::uint64_t{ub} << 32) | ua;
  out[28] = exact(static_cast<std::uint32_t>((funnel << (uc & 31)) >> 32));
  out[29] = exact(static_cast<std::uint32_t>(funnel >> (uc & 31)));
  out[30] = exact(static_cast<std::uint32_t>((funnel << std::min(uc, 32u)) >> 32));
  out[31] = exact(
      static_cast<std::uint32_t>(static_cast<std::uint64_t>(std::abs(std::int64_t{a} - b)) + uc));
  auto sext24 = [](std::uint32_t x) {
    return static_cast<std::int64_t>(static_cast<std::int32_t>(x << 8) >> 8);
  };
  out[32] = u32(sext24(ua) * sext24(ub));
  out[33] = exact(static_cast<std::uint32_t>(std::uint64_t{ua & 0xffffff} * (ub & 0xffffff)));
  {
    std::int64_t sum = c;
    for (int k = 0; k < 4; ++k) {
      sum += static_cast<std::int8_t>(ua >> (8 * k)) * static_cast<std::int8_t>(ub >> (8 * k));
    }
    out[34] = u32(sum);
  }
  out[35] = exact(bfe32(ua, ub, uc, false));
  out[36] = exact(bfe32(ua, ub, uc, true));
  {
    const std::uint32_t pos = (uc & 63) & 0xff;
    const std::uint32_t len = (uc >> 8) & 0xff;
    std::uint32_t f = ub;
    for (std::uint32_t k = 0; k < len && pos + k <= 31; ++k) {
      f = (f & ~(1u << (pos + k))) | (((ua >> k) & 1) << (pos + k));
    }
    out[37] = exact(f);
  }
  out[38] = u32((std::int64_t{a} + b) >> 1);
  out[39] = u32((std::int64_t{a} + b + 1) >> 1);
  out[40] = exact((ua & ub) ^ (~uc | ua));
  out[41] = exact(ua * ub + uc);
  out[42] =
      exact((a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 | (a == b) << 4 | (a != b) << 5 |
            (ua < ub) << 6 | (ua <= ub) << 7 | (ua > ub) << 8 | (ua >= ub) << 9);
  out[43] = u32(a > b ? c : a);
  out[44] = exact(static_cast<std::uint64_t>(std::int64_t{a} * b));
  out[45] = exact(std::uint64_t{ua} * ub);
  out[46] = u32(std::clamp<std::int64_t>(std::int64_t{a} + b, INT32_MIN, INT32_MAX));
  out[47] = u32(std::clamp<std::int64_t>(std::int64_t{a} - b, INT32_MIN, INT32_MAX));
  {
    const std::uint32_t magnitude = a < 0 ? ~ua : ua;
    out[48] = exact(magnitude == 0 ? 0xffffffffu : 31u - std::countl_zero(magnitude));
    out[49] = exact(ua == 0 ? 0xffffffffu : static_cast<std::uint32_t>(std::countl_zero(ua)));
  }
  out[50] = u32(static_cast<std::int8_t>(a));
  out[51] = u32(static_cast<std::int16_t>(a));
  out[52] = exact(ua & 0xff);
  out[53] = exact(ua == 0 ? 1u : 0u);
  out[54] = exact((ua > ub ? ua - ub : ub - ua) + uc);
  out[55] =
      exact(static_cast<std::uint32_t>((std::uint64_t{ua & 0xffffff} * (ub & 0xffffff)) >> 16));
  out[56] = exact((std::uint64_t{ua} + ub) >> 32 << 32 | std::uint32_t(ua + ub));
  out[57] = exact(std::uint64_t{ua < ub ? 0xffffffffu : 0u} << 32 | std::uint32_t(ua - ub));
  out[58] = exact(ua ^ ub ^ uc);
  out[59] = exact(prmtMode(ua, ub, uc, 0));
  out[60] = exact(prmtMode(ua, ub, uc, 1));
  out[61] = exact(prmtMode(ua, ub, uc, 2));
}

void int64Reference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const std::uint64_t ua = in[i].a;
  const std::uint64_t ub = in[i].b;
  const auto a = static_cast<std::int64_t>(ua);
  const auto b = static_cast<std::int64_t>(ub);
  auto s64 = [](std::int64_t value) { return exact(static_cast<std::uint64_t>(value)); };
  out[0] = exact(ua + ub);
  out[1] = exact(ua - ub);
  out[2] = exact(ua * ub);
  out[3] = s64(static_cast<std::int64_t>((static_cast<__int128>(a) * b) >> 64));
  out[4] = exact(static_cast<std::uint64_t>((static_cast<unsigned __int128>(ua) * ub) >> 64));
  if (b != 0) {
    out[5] = s64(a == INT64_MIN && b == -1 ? INT64_MIN : a / b);
    out[6] = s64(b == -1 ? 0 : a % b);
    out[7] = exact(ua / ub);
    out[8] = exact(ua % ub);
  }
  out[9] = s64(std::min(a, b));
  out[10] = s64(std::max(a, b));
  out[11] = exact(std::min(ua, ub));
  out[12] = exact(std::max(ua, ub));
  out[13] = s64(a == INT64_MIN ? a : std::llabs(a));
  const auto shift = static_cast<std::uint32_t>(ub);
  out[14] = exact(shift >= 64 ? 0 : ua << shift);
  out[15] = s64(shift >= 64 ? (a < 0 ? -1 : 0) : a >> shift);
  out[16] = exact(static_cast<std::uint64_t>(std::popcount(ua)));
  out[17] = exact(static_cast<std::uint64_t>(std::countl_zero(ua)));
  out[18] = exact(ua == 0 ? 0 : static_cast<std::uint64_t>(std::countr_zero(ua)) + 1);
  std::uint64_t reversed = 0;
  for (int k = 0; k < 64; ++k) reversed |= ((ua >> k) & 1) << (63 - k);
  out[19] = exact(reversed);
  out[20] = exact((a < b) | (a == b) << 1 | (ua < ub) << 2 | (ua >= ub) << 3);
  out[21] = s64(static_cast<std::int32_t>(a));
  out[22] = exact(ua & 0xffffffffull);
  out[23] = exact(ua * 3 + ub);
  out[24] = exact(ua >> (ub & 63));
  out[25] = s64(a >> (ub & 63));
}

// libdevice's full-precision functions: a few ulp from the host's libm.
constexpr double kLibdeviceUlps = 4;

void f32Reference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const float a = f32(in[i].a);
  const float b = f32(in[i].b);
  const float c = f32(in[i].c);
  auto rounded = [](int mode, auto op) { return withRounding(mode, op); };
  out[0] = same(a + b);
  out[1] = same(a - b);
  out[2] = same(a * b);
  out[3] = same(a / b);
  out[4] = same(rounded(FE_TOWARDZERO, [&] {
    volatile float x = a;
    return x + b;
  }));
  out[5] = same(rounded(FE_DOWNWARD, [&] {
    volatile float x = a;
    return x + b;
  }));
  out[6] = same(rounded(FE_UPWARD, [&] {
    volatile float x = a;
    return x + b;
  }));
  out[7] = same(rounded(FE_TOWARDZERO, [&] {
    volatile float x = a;
    return x * b;
  }));
  out[8] = same(rounded(FE_DOWNWARD, [&] {
    volatile float x = a;
    return x * b;
  }));
  out[9] = same(rounded(FE_UPWARD, [&] {
    volatile float x = a;
    return x * b;
  }));
  out[10] = same(std::fma(a, b, c));
  // Inputs through volatiles too: the compiler would compute a function of registers before the
  // rounding mode is set.
  auto fused = [&](int mode) {
    return withRounding(mode, [&] {
      volatile float x = a;
      volatile float y = b;
      volatile float z = c;
      return std::fma(float{x}, float{y}, float{z});
    });
  };
  out[11] = same(fused(FE_TOWARDZERO));
  out[12] = same(fused(FE_DOWNWARD));
  out[13] = same(fused(FE_UPWARD));
  out[14] = same(rounded(FE_TOWARDZERO, [&] {
    volatile float x = a;
    return x / b;
  }));
  out[15] = same(rounded(FE_UPWARD, [&] {
    volatile float x = a;
    return x / b;
  }));
  out[16] = same(std::sqrt(a));
  out[17] = same(rounded(FE_TOWARDZERO, [&] {
    volatile float x = a;
    return std::sqrt(float{x});
  }));
  out[18] = same(1.0f / a);
  out[19] = same(rounded(FE_DOWNWARD, [&] {
    volatile float x = a;
    return 1.0f / x;
  }));
  out[20] = same(gpuMin(a, b));
  out[21] = same(gpuMax(a, b));
  out[22] = same(std::fabs(a));
  out[23] = same(-a);
  out[24] = same(std::copysign(a, b));
  out[25] = same(std::floor(a));
  out[26] = same(std::ceil(a));
  out[27] = same(std::trunc(a));
  out[28] = same(std::nearbyint(a));
  out[29] = same(saturate(a));
  out[30] = exact((a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 | (a == b) << 4 |
                  (a != b) << 5 | std::isnan(a) << 6 | std::isinf(a) << 7 | std::isfinite(a) << 8 |
                  !(a < b) << 9 | !(a >= b) << 10);
  out[31] = same(flush(flush(a) + flush(b)));
  out[32] = same(saturate(flush(flush(a) * flush(b))));
  out[33] = same(gpuMin(a, b, true));
  out[34] = same(std::fma(a, b, c));
  out[35] = same(std::round(a));
  out[36] = same(std::fdim(a, b));
  out[37] = same(std::fmod(a, b));
  out[38] = same(std::ldexp(a, static_cast<int>(in[i].c & 63) - 32));
  out[39] = exact(std::signbit(a) ? 1 : 0);
  // The approximate functions, where the PTX ISA bounds their error (and a GPU meets them).
  const bool small = std::isfinite(a) && std::fabs(a) <= 3.0f;
  if (std::isfinite(a) && std::isfinite(b) && std::fabs(b) < 1e30f && std::fabs(b) > 1e-30f) {
    out[40] = relative(a / b, 1e-6);
  }
  if (small) {
    out[41] = relative(std::sin(a), 1e-6);
    out[42] = relative(std::cos(a), 1e-6);
    out[43] = relative(std::exp(a), 1e-5);
    if (a > 0.01f) out[44] = relative(std::log2(a), 1e-5);
    if (a > 0.0f) out[45] = relative(1.0f / std::sqrt(a), 1e-6);
    out[47] = relative(std::tanh(a), 1e-3);
  }
  if (std::isfinite(a) && a > 0) out[46] = ulps(static_cast<float>(1.0 / std::sqrt(double{a})), 1);
  // libdevice's functions, computed by PTX arithmetic.
  if (std::isfinite(a) && std::fabs(a) < 1e4f) out[48] = ulps(std::sin(a), kLibdeviceUlps);
  out[49] = ulps(std::exp(a), kLibdeviceUlps);
  out[50] = ulps(std::log(a), kLibdeviceUlps);
  if (std::isfinite(a) && std::isfinite(b) && a > 0 && std::fabs(b) < 64) {
    out[51] = ulps(std::pow(a, b), 8);
  }
  out[52] = ulps(std::tanh(a), kLibdeviceUlps);
  out[53] = ulps(std::atan2(a, b), kLibdeviceUlps);
  out[54] = same(std::sqrt(a));
  out[55] = same(a / b);
  out[56] = ulps(std::cbrt(a), kLibdeviceUlps);
  out[57] = ulps(std::erf(a), kLibdeviceUlps);
}

void f64Reference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const double a = f64(in[i].a);
  const double b = f64(in[i].b);
  const double c = f64(in[i].c);
  auto rounded = [](int mode, auto op) { return withRounding(mode, op); };
  out[0] = same(a + b);
  out[1] = same(a - b);
  out[2] = same(a * b);
  out[3] = same(a / b);
  out[4] = same(rounded(FE_TOWARDZERO, [&] {
    volatile double x = a;
    return x + b;
  }));
  out[5] = same(rounded(FE_DOWNWARD, [&] {
    volatile double x = a;
    return x + b;
  }));
  out[6] = same(rounded(FE_UPWARD, [&] {
    volatile double x = a;
    return x + b;
  }));
  out[7] = same(rounded(FE_TOWARDZERO, [&] {
    volatile double x = a;
    return x * b;
  }));
  out[8] = same(std::fma(a, b, c));
  auto fused = [&](int mode) {
    return withRounding(mode, [&] {
      volatile double x = a;
      volatile double y = b;
      volatile double z = c;
      return std::fma(double{x}, double{y}, double{z});
    });
  };
  out[9] = same(fused(FE_TOWARDZERO));
  out[10] = same(rounded(FE_TOWARDZERO, [&] {
    volatile double x = a;
    return x / b;
  }));
  out[11] = same(std::sqrt(a));
  out[12] = same(rounded(FE_UPWARD, [&] {
    volatile double x = a;
    return std::sqrt(double{x});
  }));
  out[13] = same(1.0 / a);
  out[14] = same(gpuMin(a, b));
  out[15] = same(gpuMax(a, b));
  out[16] = same(std::fabs(a));
  out[17] = same(-a);
  out[18] = same(std::floor(a));
  out[19] = same(std::ceil(a));
  out[20] = same(std::trunc(a));
  out[21] = same(std::nearbyint(a));
  out[22] = exact((a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 | (a == b) << 4 |
                  (a != b) << 5 | std::isnan(a) << 6 | std::isinf(a) << 7);
  out[23] = same(fused(FE_DOWNWARD));
  out[24] = same(std::copysign(a, b));
  out[25] = same(std::sqrt(a));
  out[26] = same(a / b);
  out[27] = ulps(std::exp(a), kLibdeviceUlps);
  out[28] = ulps(std::log(a), kLibdeviceUlps);
  if (std::isfinite(a) && std::fabs(a) < 1e6) out[29] = ulps(std::sin(a), kLibdeviceUlps);
  if (std::isfinite(a) && std::isfinite(b) && a > 0 && std::fabs(b) < 64) {
    out[30] = ulps(std::pow(a, b), kLibdeviceUlps);
  }
}

void convertReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const float f = f32(in[i].a);
  const double d = f64(in[i].b);
  const auto l = static_cast<std::int64_t>(in[i].c);
  const auto k = static_cast<std::int32_t>(in[i].c);
  auto u32 = [](std::int64_t value) { return exact(static_cast<std::uint32_t>(value)); };
  out[0] = u32(toInt<std::int32_t>(f, FE_TONEAREST));
  out[1] = u32(toInt<std::int32_t>(f, FE_TOWARDZERO));
  out[2] = u32(toInt<std::int32_t>(f, FE_DOWNWARD));
  out[3] = u32(toInt<std::int32_t>(f, FE_UPWARD));
  out[4] = exact(toInt<std::uint32_t>(f, FE_TOWARDZERO));
  out[5] = exact(static_cast<std::uint64_t>(toInt<std::int64_t>(f, FE_TOWARDZERO)));
  out[6] = exact(toInt<std::uint64_t>(f, FE_TONEAREST));
  out[7] = u32(toInt<std::int32_t>(d, FE_TOWARDZERO));
  out[8] = exact(static_cast<std::uint64_t>(toInt<std::int64_t>(d, FE_TONEAREST)));
  out[9] = exact(toInt<std::uint32_t>(d, FE_UPWARD));
  auto intToFloat = [](int mode, auto value) {
    return withRounding(mode, [&] {
      volatile auto x = value;
      return static_cast<float>(x);
    });
  };
  auto intToDouble = [](int mode, auto value) {
    return withRounding(mode, [&] {
      volatile auto x = value;
      return static_cast<double>(x);
    });
  };
  out[10] = same(intToFloat(FE_TONEAREST, k));
  out[11] = same(intToFloat(FE_TOWARDZERO, k));
  out[12] = same(intToFloat(FE_DOWNWARD, k));
  out[13] = same(intToFloat(FE_UPWARD, k));
  out[14] = same(intToFloat(FE_TONEAREST, static_cast<std::uint32_t>(k)));
  out[15] = same(intToFloat(FE_TONEAREST, l));
  out[16] = same(intToFloat(FE_TOWARDZERO, static_cast<std::uint64_t>(l)));
  out[17] = same(intToDouble(FE_TONEAREST, l));
  out[18] = same(intToDouble(FE_DOWNWARD, l));
  out[19] = same(static_cast<double>(k));
  auto narrow = [](int mode, double value) {
    return withRounding(mode, [&] {
      volatile double x = value;
      return static_cast<float>(x);
    });
  };
  out[20] = same(narrow(FE_TONEAREST, d));
  out[21] = same(narrow(FE_TOWARDZERO, d));
  out[22] = same(narrow(FE_DOWNWARD, d));
  out[23] = same(narrow(FE_UPWARD, d));
  out[24] = same(static_cast<double>(f));
  if (!std::isnan(f)) {
    out[25] = exact(toHalf(f));
    out[26] = exact(toHalf(f, FE_TOWARDZERO));
    out[27] = exact(toHalf(f, FE_DOWNWARD));
    out[28] = exact(toHalf(f, FE_UPWARD));
    out[30] = exact(toBf16(f, false));
    out[31] = exact(toBf16(f, true));
  }
  const auto h = static_cast<std::uint16_t>(in[i].c);
  out[29] = same(static_cast<float>(fromHalf(h)));
  out[32] = same(fromBf16(h));
  if (!std::isnan(d)) out[33] = exact(toHalf(d));
  out[34] = exact(toHalf(static_cast<double>(k)));
  if (!std::isnan(f) && !std::isnan(d)) {
    out[35] = exact(std::uint64_t{toHalf(static_cast<float>(d))} << 16 | toHalf(f));
  }
  out[36] = u32(toInt<std::int32_t>(f, FE_TOWARDZERO));
  out[37] = exact(static_cast<std::uint8_t>(k));
  out[38] =
      exact(static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int16_t>(k))));
  out[39] = same(std::nearbyint(f));
  out[40] = u32(std::clamp(k, -128, 127));
  if (!std::isnan(f)) out[41] = exact(toHalf(f < 0 ? 0.0 : f));
  out[42] = exact(toHalf(static_cast<double>(static_cast<std::uint16_t>(k))));
}

void halfReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const auto ha = static_cast<std::uint16_t>(in[i].a);
  const auto hb = static_cast<std::uint16_t>(in[i].b);
  const auto hc = static_cast<std::uint16_t>(in[i].c);
  const double a = fromHalf(ha);
  const double b = fromHalf(hb);
  const double c = fromHalf(hc);
  auto half = [](double value) { return Expect{Compare::kHalfUlp, toHalf(value), 0}; };
  auto nanOr = [&](double value) {
    return std::isnan(value) ? Expect{} : half(value);  // NaN payloads: any NaN will do
  };
  out[0] = nanOr(a + b);
  out[1] = nanOr(a - b);
  out[2] = nanOr(a * b);
  out[3] = nanOr(std::fma(a, b, c));
  out[4] = exact(ha ^ 0x8000u);
  out[5] = exact(ha & 0x7fffu);
  out[6] = nanOr(gpuMin(a, b));
  out[7] = nanOr(gpuMax(a, b));
  out[8] = exact((a < b) | (a <= b) << 1 | (a > b) << 2 | (a == b) << 3 |
                 (a != b && !std::isnan(a) && !std::isnan(b)) << 4 | std::isnan(a) << 5 |
                 (std::isnan(a) || std::isnan(b) || a < b) << 6);
  out[9] = nanOr(std::isnan(a + b) ? a + b : saturate(static_cast<float>(a + b)));
  if (!std::isnan(a) && !std::isnan(b) && !std::isnan(c)) {
    const double fused = std::fma(a, b, c);
    out[10] = half(fused <= 0 ? 0.0 : fused);  // relu: max(x, +0)
  }
  auto pair = [&](double low, double high) -> Expect {
    if (std::isnan(low) || std::isnan(high)) return {};
    return exact(std::uint64_t{toHalf(high)} << 16 | toHalf(low));
  };
  out[11] = pair(a + b, b + c);
  out[12] = pair(a * b, b * c);
  out[13] = pair(std::fma(a, b, a), std::fma(b, c, b));
  out[14] = exact(((a < b) && (b < c)) | ((a == b) && (b == c)) << 1);
  const float p = fromBf16(ha);
  const float q = fromBf16(hb);
  if (!std::isnan(p + q)) out[15] = exact(toBf16(p + q, false));
  if (!std::isnan(p * q)) out[16] = exact(toBf16(p * q, false));
  if (!std::isnan(a) && a >= 0) out[17] = Expect{Compare::kHalfUlp, toHalf(std::sqrt(a)), 1};
}

// ---- Warps, blocks, atomics, memory, control: whole-launch references --------------------------

void warpReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const std::size_t lane = i % 32;
  const std::size_t base = i - lane;
  auto value = [&](std::size_t l) { return static_cast<std::uint32_t>(in[base + l].a); };
  const std::uint32_t v = value(lane);
  auto ballot = [&](auto predicate, std::size_t from, std::size_t to) {
    std::uint32_t mask = 0;
    for (std::size_t l = from; l < to; ++l)
      mask |= static_cast<std::uint32_t>(predicate(value(l))) << l;
    return mask;
  };
  out[0] = exact(value(7));
  out[1] = exact(value(31 - lane));
  out[2] = exact(lane >= 3 ? value(lane - 3) : v);
  out[3] = exact(lane + 5 <= 31 ? value(lane + 5) : v);
  out[4] = exact(value(lane ^ 6));
  out[5] = exact(value((lane & ~std::size_t{7}) + 2));
  out[6] = exact((lane & 15) >= 1 ? value(lane - 1) : v);
  out[7] = exact((lane & 7) + 3 < 8 ? value(lane + 3) : v);
  out[8] = exact(value(lane ^ 1));
  out[9] = exact(ballot([](std::uint32_t x) { return x & 1; }, 0, 32));
  out[10] = exact(ballot([](std::uint32_t x) { return x == 5; }, 0, 32) != 0);
  out[11] = exact(ballot([](std::uint32_t x) { return x != 0; }, 0, 32) == 0xffffffffu);
  out[12] = exact(ballot([&](std::uint32_t x) { return (x & 3) == (v & 3); }, 0, 32));
  const bool allSame =
      ballot([&](std::uint32_t x) { return x / 1000 == v / 1000; }, 0, 32) == 0xffffffffu;
  out[13] = exact(allSame ? 0xffffffffu : 0u);
  out[14] = exact(allSame ? 1 : 0);
  if (lane < 16) {
    out[15] = exact(value(15 - lane));
    out[16] = exact(ballot([](std::uint32_t x) { return (x & 2) != 0; }, 0, 16));
    out[17] = exact(0x0000ffffu);
  } else {
    out[15] = exact(lane + 1 <= 31 ? value(lane + 1) : v);
    out[16] = exact(ballot([](std::uint32_t x) { return (x & 4) != 0; }, 16, 32));
    out[17] = exact(0xffff0000u);
  }
  if ((lane & 1) != 0) {
    out[18] = exact(value(lane ^ 2));
    out[19] = exact(16);
  }
  out[20] = exact(value(0) * 3);
  std::uint32_t total = 0;
  for (std::uint32_t k = 0; k < (v & 7); ++k) total += k * static_cast<std::uint32_t>(lane);
  out[21] = exact(total);
  out[22] = exact(0xffffffffu);
  out[23] = exact(lane);
  out[24] = exact((1u << lane) - 1);
}

constexpr unsigned kBlockThreads = 256;

void blockReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const std::size_t t = i % kBlockThreads;
  const std::size_t base = i - t;
  auto value = [&](std::size_t k) { return static_cast<std::uint32_t>(in[base + k].a); };
  std::uint64_t total = 0;
  std::uint32_t odd = 0;
  bool all = true;
  bool any = false;
  for (std::size_t k = 0; k < kBlockThreads; ++k) {
    total += value(k);
    odd += value(k) & 1;
    all = all && value(k) != 0;
    any = any || value(k) == 7;
  }
  out[0] = exact(total);
  out[1] = exact(value(kBlockThreads - 1 - t));
  out[2] = exact(odd);
  out[3] = exact(all ? 1 : 0);
  out[4] = exact(any ? 1 : 0);
  out[5] = exact(t < 64 ? 1234 : 0);
  out[6] = exact(t + 1000 * (i / kBlockThreads));
  out[7] = exact(1);
  out[8] = exact(kBlockThreads * 4);
}

void earlyExitReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  if ((in[i].a & 1) != 0) return;
  const std::size_t base = i - i % kBlockThreads;
  std::uint32_t even = 0;
  for (std::size_t k = 0; k < kBlockThreads; ++k) even += (in[base + k].a & 1) == 0;
  out[0] = exact(even);
}

struct Dims {
  unsigned x, y, z;
};
constexpr Dims kIndexGrid{3, 2, 2};
constexpr Dims kIndexBlock{4, 3, 2};

void indicesReference(const std::vector<In>&, std::size_t i, Expect* out) {
  const unsigned perBlock = kIndexBlock.x * kIndexBlock.y * kIndexBlock.z;
  const unsigned block = static_cast<unsigned>(i) / perBlock;
  const unsigned thread = static_cast<unsigned>(i) % perBlock;
  const unsigned tx = thread % kIndexBlock.x;
  const unsigned ty = (thread / kIndexBlock.x) % kIndexBlock.y;
  const unsigned tz = thread / (kIndexBlock.x * kIndexBlock.y);
  const unsigned bx = block % kIndexGrid.x;
  const unsigned by = (block / kIndexGrid.x) % kIndexGrid.y;
  const unsigned bz = block / (kIndexGrid.x * kIndexGrid.y);
  out[0] = exact(tx | ty << 10 | std::uint64_t{tz} << 20);
  out[1] = exact(bx | by << 10 | std::uint64_t{bz} << 20);
  out[2] = exact(kIndexBlock.x | kIndexBlock.y << 10 | std::uint64_t{kIndexBlock.z} << 20);
  out[3] = exact(kIndexGrid.x | kIndexGrid.y << 10 | std::uint64_t{kIndexGrid.z} << 20);
}

// ---- SIMD: byte and half-word lanes ------------------------------------------------------------

// Lane `index` of `word`, `width` bits wide, sign-extended when `isSigned`.
std::int64_t laneOf(std::uint32_t word, unsigned index, unsigned width, bool isSigned) {
  const std::uint32_t raw = (word >> (width * index)) & ((1u << width) - 1);
  if (isSigned && ((raw >> (width - 1)) & 1) != 0) return std::int64_t{raw} - (1ll << width);
  return raw;
}
// A word whose lane k is value(k) cut to `width` bits.
template <typename Value>
std::uint32_t fromLanes(unsigned width, Value value) {
  std::uint32_t word = 0;
  for (unsigned k = 0; k < 32 / width; ++k) {
    word |= (static_cast<std::uint32_t>(value(k)) & ((1u << width) - 1)) << (width * k);
  }
  return word;
}
std::int64_t saturate(std::int64_t value, unsigned width, bool isSigned) {
  const std::int64_t high = isSigned ? (1ll << (width - 1)) - 1 : (1ll << width) - 1;
  const std::int64_t low = isSigned ? -(1ll << (width - 1)) : 0;
  return std::clamp(value, low, high);
}
// Rounds half away from zero, as the video instructions' average does.
std::int64_t roundedAverage(std::int64_t x, std::int64_t y) {
  const std::int64_t sum = x + y;
  return sum >= 0 ? (sum + 1) / 2 : -((-sum + 1) / 2);
}

void simdReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const auto a = static_cast<std::uint32_t>(in[i].a);
  const auto b = static_cast<std::uint32_t>(in[i].b);
  const auto c = static_cast<std::uint32_t>(in[i].c);
  // Lane k of a and b as bytes (8) or half-words (16), signed or not.
  auto x = [&](unsigned k, unsigned width, bool isSigned) { return laneOf(a, k, width, isSigned); };
  auto y = [&](unsigned k, unsigned width, bool isSigned) { return laneOf(b, k, width, isSigned); };
  auto absDiff = [&](unsigned width, bool isSigned) {
    return fromLanes(
        width, [&](unsigned k) { return std::abs(x(k, width, isSigned) - y(k, width, isSigned)); });
  };
  auto sumAbsDiff = [&](unsigned width, bool isSigned) {
    std::int64_t sum = 0;
    for (unsigned k = 0; k < 32 / width; ++k)
      sum += std::abs(x(k, width, isSigned) - y(k, width, isSigned));
    return static_cast<std::uint32_t>(sum);
  };
  // f(lane of a, lane of b) in each lane.
  auto each = [&](unsigned width, bool isSigned, auto f) {
    return fromLanes(width,
                     [&](unsigned k) { return f(x(k, width, isSigned), y(k, width, isSigned)); });
  };
  auto mn = [](std::int64_t p, std::int64_t q) { return std::min(p, q); };
  auto mx = [](std::int64_t p, std::int64_t q) { return std::max(p, q); };
  out[0] = exact(absDiff(8, false));
  out[1] = exact(absDiff(8, true));
  out[2] = exact(sumAbsDiff(8, false));
  out[3] = exact(sumAbsDiff(8, true));
  out[4] = exact(absDiff(16, false));
  out[5] = exact(absDiff(16, true));
  out[6] = exact(sumAbsDiff(16, false));
  out[7] = exact(sumAbsDiff(16, true));
  out[8] = exact(each(16, false, [](auto p, auto q) { return p + q; }));
  out[9] = exact(each(16, true, [](auto p, auto q) { return saturate(p + q, 16, true); }));
  out[10] = exact(each(16, false, [](auto p, auto q) { return saturate(p + q, 16, false); }));
  out[11] = exact(each(16, false, [](auto p, auto q) { return p - q; }));
  out[12] = exact(each(16, true, [](auto p, auto q) { return saturate(p - q, 16, true); }));
  out[13] = exact(each(16, false, [](auto p, auto q) { return saturate(p - q, 16, false); }));
  out[14] = exact(each(16, true, mn));
  out[15] = exact(each(16, false, mn));
  out[16] = exact(each(16, true, mx));
  out[17] = exact(each(16, false, mx));
  out[18] = exact(each(16, true, roundedAverage));
  out[19] = exact(each(16, false, [](auto p, auto q) { return (p + q + 1) / 2; }));
  out[20] = exact(each(16, false, [](auto p, auto q) { return (p + q) / 2; }));
  out[21] = exact(each(8, false, [](auto p, auto q) { return p + q; }));
  out[22] = exact(each(8, true, [](auto p, auto q) { return saturate(p + q, 8, true); }));
  out[23] = exact(each(8, false, [](auto p, auto q) { return saturate(p + q, 8, false); }));
  out[24] = exact(each(8, false, [](auto p, auto q) { return p - q; }));
  out[25] = exact(each(8, false, [](auto p, auto q) { return saturate(p - q, 8, false); }));
  out[26] = exact(each(8, true, mn));
  out[27] = exact(each(8, false, mx));
  out[28] = exact(each(8, false, [](auto p, auto q) { return (p + q + 1) / 2; }));
  out[29] = exact(each(8, false, [](auto p, auto q) { return p > q ? 0xff : 0; }));
  out[30] = exact(each(16, true, [](auto p, auto q) { return p >= q ? 0xffff : 0; }));
  out[31] = exact(each(8, false, [](auto p, auto q) { return p == q ? 1 : 0; }));
  out[32] = exact(fromLanes(16, [&](unsigned k) { return -x(k, 16, true); }));
  out[33] = exact(fromLanes(
      8, [&](unsigned k) { return std::min<std::int64_t>(std::abs(x(k, 8, true)), 127); }));
  // vadd4.u32.u32.u32.sat
  out[34] = exact(each(8, false, [](auto p, auto q) { return saturate(p + q, 8, false); }));
  // vsub4.s32.s32.s32.sat d.b20: lanes 0 and 2 computed, 1 and 3 from c.
  out[35] = exact(fromLanes(8, [&](unsigned k) {
    return k % 2 == 0 ? saturate(x(k, 8, true) - y(k, 8, true), 8, true) : laneOf(c, k, 8, false);
  }));
  // vabsdiff4.u32.u32.u32.add: c plus the four differences.
  out[36] = exact(c + sumAbsDiff(8, false));
  // vavrg4.s32.s32.s32 a.b0123, b.b4444: a's bytes reversed against b's byte 0 in every lane.
  out[37] = exact(
      fromLanes(8, [&](unsigned k) { return roundedAverage(x(3 - k, 8, true), y(0, 8, true)); }));
  // vmin2.s32.s32.s32.add: c plus both lanes' minimum.
  out[38] = exact(static_cast<std::uint32_t>(c + std::min(x(0, 16, true), y(0, 16, true)) +
                                             std::min(x(1, 16, true), y(1, 16, true))));
  // vmax2.u32.u32.u32 d.h1, a.h01, b.h23: lane 1 the maximum of a's and b's low halves; lane 0 c's.
  out[39] = exact(fromLanes(16, [&](unsigned k) {
    return k == 1 ? std::max(x(0, 16, false), y(0, 16, false)) : laneOf(c, 0, 16, false);
  }));
  // vset4.u32.u32.lt
  out[40] = exact(each(8, false, [](auto p, auto q) { return p < q ? 1 : 0; }));
  // vset2.s32.s32.ge.add: c plus how many lanes compared true.
  out[41] = exact(c + (x(0, 16, true) >= y(0, 16, true)) + (x(1, 16, true) >= y(1, 16, true)));
  // vavrg2.u32.u32.u32
  out[42] = exact(each(16, false, [](auto p, auto q) { return (p + q + 1) / 2; }));
  // vadd2.s32.s32.u32.sat: signed a, unsigned b, clamped to signed half-words.
  out[43] = exact(fromLanes(
      16, [&](unsigned k) { return saturate(x(k, 16, true) + y(k, 16, false), 16, true); }));
  // vset4.s32.u32.ne d.b31, a, b.b3210: each byte of a signed against itself unsigned (differs
  // when its top bit is set), in lanes 3 and 1; lanes 2 and 0 from c.
  out[44] = exact(fromLanes(8, [&](unsigned k) {
    return k % 2 == 1 ? (x(k, 8, true) != x(k, 8, false) ? 1 : 0) : laneOf(c, k, 8, false);
  }));
  // vabsdiff2.s32.s32.s32.sat a.h32, b.h10: b's halves against a's, clamped to signed.
  out[45] = exact(fromLanes(16, [&](unsigned k) {
    return saturate(std::abs(y(k, 16, true) - x(k, 16, true)), 16, true);
  }));
  // vmax4.s32.s32.s32.add d.b310: c plus the maxima of lanes 3, 1 and 0.
  std::int64_t maxima = c;
  for (const unsigned k : {0u, 1u, 3u}) maxima += std::max(x(k, 8, true), y(k, 8, true));
  out[46] = exact(static_cast<std::uint32_t>(maxima));
  // max.relu.s16x2, min.relu.s32
  out[47] = exact(
      each(16, true, [](auto p, auto q) { return std::max<std::int64_t>(std::max(p, q), 0); }));
  out[48] = exact(static_cast<std::uint32_t>(
      std::max(std::min(static_cast<std::int32_t>(a), static_cast<std::int32_t>(b)), 0)));
}

// ---- fp8 ------------------------------------------------------------------------------------

// f32 values around fp8's limits (E4M3: 448 largest, 2^-9 smallest; E5M2: 57344, 2^-16) and
// halfway points, as f32 bits; also used as halves (their low 16 bits) and fp8 pairs.
std::vector<std::uint32_t> fp8Edges() {
  std::vector<std::uint32_t> edges = floatEdges();
  for (const float value :
       {448.0f, 464.0f, 465.0f, 480.0f, 57344.0f, 61440.0f, 65504.0f, 0.001953125f, 0.0009765625f,
        0.0029296875f, 1.0f / 65536, 1.0f / 131072, 1.0625f, 1.1875f, 3.5f, -0.3f}) {
    edges.push_back(std::bit_cast<std::uint32_t>(value));
    edges.push_back(std::bit_cast<std::uint32_t>(-value));
  }
  return edges;
}

// NVIDIA's own host conversions (cuda_fp8.h) are the reference.
void fp8Reference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const float2 floats = make_float2(f32(in[i].a), f32(in[i].b));
  __half2_raw halves;
  halves.x = static_cast<unsigned short>(in[i].c);
  halves.y = static_cast<unsigned short>(in[i].c >> 16);
  const auto pair = static_cast<__nv_fp8x2_storage_t>(in[i].c);
  out[0] = exact(__nv_cvt_float2_to_fp8x2(floats, __NV_SATFINITE, __NV_E4M3));
  out[1] = exact(__nv_cvt_float2_to_fp8x2(floats, __NV_SATFINITE, __NV_E5M2));
  out[2] = exact(__nv_cvt_halfraw2_to_fp8x2(halves, __NV_SATFINITE, __NV_E4M3));
  out[3] = exact(__nv_cvt_halfraw2_to_fp8x2(halves, __NV_SATFINITE, __NV_E5M2));
  const __half2_raw fromE4m3 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  const __half2_raw fromE5m2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E5M2);
  out[4] = exact(fromE4m3.x | static_cast<std::uint32_t>(fromE4m3.y) << 16);
  out[5] = exact(fromE5m2.x | static_cast<std::uint32_t>(fromE5m2.y) << 16);
  // .relu: what is negative converts as zero (NaN stays NaN).
  const float2 clamped =
      make_float2(floats.x < 0 ? 0.0f : floats.x, floats.y < 0 ? 0.0f : floats.y);
  out[6] = exact(__nv_cvt_float2_to_fp8x2(clamped, __NV_SATFINITE, __NV_E4M3));
}

// ---- Running one class -----------------------------------------------------------------------

struct Launch {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {128, 1, 1};
  unsigned sharedBytes = 0;
};

struct Runner {
  CUmodule module = nullptr;
  bool verbose = false;
  std::uint64_t checked = 0;
  int failures = 0;

  // Runs `kernel` over `rows` with extra arguments after (in, results, n); returns the results.
  std::vector<std::uint64_t> run(const char* kernel, const std::vector<In>& rows,
                                 const Launch& launch, std::vector<void*> extra = {}) {
    CUfunction function;
    CHECK(cuModuleGetFunction(&function, module, kernel));
    const std::size_t n = rows.size();
    CUdeviceptr input;
    CUdeviceptr output;
    CHECK(cuMemAlloc(&input, std::max<std::size_t>(n, 1) * sizeof(In)));
    CHECK(cuMemAlloc(&output, std::max<std::size_t>(n, 1) * kSlots * sizeof(std::uint64_t)));
    std::vector<std::uint64_t> results(n * kSlots, kUnset);
    if (n > 0) {
      CHECK(cuMemcpyHtoD(input, rows.data(), n * sizeof(In)));
      CHECK(cuMemcpyHtoD(output, results.data(), results.size() * sizeof(std::uint64_t)));
    }
    int count = static_cast<int>(n);
    std::vector<void*> arguments{&input, &output, &count};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    CHECK(cuLaunchKernel(function, launch.grid[0], launch.grid[1], launch.grid[2], launch.block[0],
                         launch.block[1], launch.block[2], launch.sharedBytes, nullptr,
                         arguments.data(), nullptr));
    CHECK(cuCtxSynchronize());
    if (n > 0) CHECK(cuMemcpyDtoH(results.data(), output, results.size() * sizeof(std::uint64_t)));
    CHECK(cuMemFree(input));
    CHECK(cuMemFree(output));
    return results;
  }

  void compare(const char* name, const std::vector<In>& rows,
               const std::vector<std::uint64_t>& results, const Reference& reference) {
    int shown = 0;
    std::uint64_t here = 0;
    int wrong = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      Expect expected[kSlots];
      reference(rows, i, expected);
      for (int slot = 0; slot < kSlots; ++slot) {
        if (expected[slot].how == Compare::kSkip) continue;
        ++here;
        const std::uint64_t got = results[i * kSlots + slot];
        if (matches(expected[slot], got)) continue;
        ++wrong;
        if (shown++ < 12 || verbose) {
          std::printf(
              "  MISMATCH %s slot %d row %zu (a=%#llx b=%#llx c=%#llx): expected %#llx, "
              "got %#llx\n",
              name, slot, i, static_cast<unsigned long long>(rows[i].a),
              static_cast<unsigned long long>(rows[i].b),
              static_cast<unsigned long long>(rows[i].c),
              static_cast<unsigned long long>(expected[slot].value),
              static_cast<unsigned long long>(got));
        }
      }
    }
    checked += here;
    failures += wrong;
    std::printf("%-12s %8llu results, %d wrong\n", name, static_cast<unsigned long long>(here),
                wrong);
  }

  void expect(const char* what, std::uint64_t want, std::uint64_t got) {
    ++checked;
    if (want == got) return;
    ++failures;
    std::printf("  MISMATCH %s: expected %#llx, got %#llx\n", what,
                static_cast<unsigned long long>(want), static_cast<unsigned long long>(got));
  }
};

Launch oneDimensional(std::size_t rows, unsigned block = 128) {
  Launch launch;
  launch.block[0] = block;
  launch.grid[0] = static_cast<unsigned>((rows + block - 1) / block);
  return launch;
}

void runAtomics(Runner& runner, std::mt19937_64& random) {
  constexpr unsigned kThreads = 1024;
  std::vector<In> rows(kThreads);
  for (In& row : rows) row.a = random() % 100000 + 1;
  std::uint64_t counters[16] = {};
  auto* words = reinterpret_cast<std::uint32_t*>(counters);
  words[2] = 0x7fffffffu;
  words[4] = 0xffffffffu;
  counters[7] = static_cast<std::uint64_t>(INT64_MIN);
  CUdeviceptr device;
  CHECK(cuMemAlloc(&device, sizeof(counters)));
  CHECK(cuMemcpyHtoD(device, counters, sizeof(counters)));
  Launch launch;
  launch.grid[0] = kThreads / 256;
  launch.block[0] = 256;
  const std::vector<std::uint64_t> results = runner.run("conf_atomic", rows, launch, {&device});
  CHECK(cuMemcpyDtoH(counters, device, sizeof(counters)));
  CHECK(cuMemFree(device));

  std::uint32_t sum = 0;
  std::int32_t minimum = INT32_MAX;
  std::uint32_t maximum = 0;
  std::uint32_t andAll = 0xffffffffu;
  std::uint32_t orAll = 0;
  std::uint32_t xorAll = 0;
  float floatSum = 0;
  std::uint64_t wideSum = 0;
  double doubleSum = 0;
  std::int64_t wideMax = INT64_MIN;
  for (const In& row : rows) {
    const auto v = static_cast<std::uint32_t>(row.a);
    sum += v;
    minimum = std::min(minimum, static_cast<std::int32_t>(v));
    maximum = std::max(maximum, v);
    andAll &= v | 0xf0f0f0f0u;
    orAll |= v & 0x01010101u;
    xorAll ^= v;
    floatSum += static_cast<float>(v & 0xff);
    wideSum += std::uint64_t{v} << 20;
    doubleSum += static_cast<double>(v & 0xffff);
    wideMax = std::max(wideMax, static_cast<std::int64_t>(v) - 100000);
  }
  runner.expect("atomicAdd tickets", kThreads, words[0]);
  runner.expect("atomicAdd", sum, words[1]);
  runner.expect("atomicMin", static_cast<std::uint32_t>(minimum), words[2]);
  runner.expect("atomicMax", maximum, words[3]);
  runner.expect("atomicAnd", andAll, words[4]);
  runner.expect("atomicOr", orAll, words[5]);
  runner.expect("atomicXor", xorAll, words[6]);
  runner.expect("atomicInc", kThreads % 10, words[7]);
  runner.expect("atomicDec", (10 - kThreads % 10) % 10, words[8]);
  runner.expect("atomicAdd float", std::bit_cast<std::uint32_t>(floatSum), words[9]);
  runner.expect("atomicAdd u64", wideSum, counters[5]);
  runner.expect("atomicAdd double", std::bit_cast<std::uint64_t>(doubleSum), counters[6]);
  runner.expect("atomicMax s64", static_cast<std::uint64_t>(wideMax), counters[7]);
  runner.expect("atomicCAS max", maximum, words[16]);
  runner.expect("atomicCAS u64", 77, counters[9]);
  std::vector<bool> seen(kThreads, false);
  for (unsigned t = 0; t < kThreads; ++t) {
    const std::uint64_t ticket = results[t * kSlots];
    if (ticket < kThreads) seen[ticket] = true;
  }
  runner.expect("every ticket once", kThreads,
                static_cast<std::uint64_t>(std::count(seen.begin(), seen.end(), true)));
  runner.compare("atomic", rows, results,
                 [&](const std::vector<In>& in, std::size_t i, Expect* out) {
                   const std::size_t base = i - i % 256;
                   std::int32_t blockMax = INT32_MIN;
                   for (std::size_t k = 0; k < 256; ++k)
                     blockMax = std::max(blockMax, static_cast<std::int32_t>(in[base + k].a));
                   out[1] = exact(1);
                   out[2] = exact(1);
                   out[3] = exact(256);
                   out[4] = exact(static_cast<std::uint32_t>(blockMax));
                   out[5] = exact(std::bit_cast<std::uint32_t>(256.0f));
                 });
}

void runMemory(Runner& runner, std::mt19937_64& random) {
  constexpr unsigned kThreads = 256;
  std::vector<In> rows(kThreads);
  for (In& row : rows) row.a = random() % 1000;
  struct Pair {
    int first;
    double second;
    char tag[3];
  };
  Pair pair{-7, 2.5, {'x', 'y', 'z'}};
  std::vector<float> vectors(kThreads * 4);
  for (std::size_t k = 0; k < vectors.size(); ++k) vectors[k] = static_cast<float>(k % 17);
  std::vector<std::int16_t> narrow(kThreads * 2);
  for (std::size_t k = 0; k < narrow.size(); ++k) {
    narrow[k] =
        static_cast<std::int16_t>(k % 2 == 0 ? -static_cast<int>(k) : static_cast<int>(k) * 100);
  }
  CUdeviceptr deviceVectors;
  CUdeviceptr deviceNarrow;
  CHECK(cuMemAlloc(&deviceVectors, vectors.size() * sizeof(float)));
  CHECK(cuMemAlloc(&deviceNarrow, narrow.size() * sizeof(std::int16_t)));
  CHECK(cuMemcpyHtoD(deviceVectors, vectors.data(), vectors.size() * sizeof(float)));
  CHECK(cuMemcpyHtoD(deviceNarrow, narrow.data(), narrow.size() * sizeof(std::int16_t)));
  const std::vector<std::uint64_t> results = runner.run(
      "conf_memory", rows, oneDimensional(kThreads, 64), {&pair, &deviceVectors, &deviceNarrow});
  std::vector<std::int16_t> after(narrow.size());
  CHECK(cuMemcpyDtoH(after.data(), deviceNarrow, after.size() * sizeof(std::int16_t)));
  CHECK(cuMemFree(deviceVectors));
  CHECK(cuMemFree(deviceNarrow));
  for (unsigned t = 0; t < kThreads; ++t) {
    runner.expect("short2 stored", static_cast<std::uint16_t>(-narrow[2 * t + 1]),
                  static_cast<std::uint16_t>(after[2 * t]));
    runner.expect("short2 stored", static_cast<std::uint16_t>(narrow[2 * t]),
                  static_cast<std::uint16_t>(after[2 * t + 1]));
  }
  static constexpr int kTable[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
  static constexpr double kCoefficients[4] = {0.5, -1.25, 2.0, 1e-3};
  static constexpr std::uint64_t kWords[4] = {1ull, 2ull << 40, 3ull, 0xffffffffffffffffull};
  static constexpr char kMessage[] = "constant bytes";
  runner.compare(
      "memory", rows, results, [&](const std::vector<In>& in, std::size_t i, Expect* out) {
        const auto v = static_cast<std::uint32_t>(in[i].a);
        out[0] = exact(v * (v & 15) + 1);
        out[1] = exact(static_cast<std::uint32_t>(kTable[v & 15]));
        out[2] = exact(std::bit_cast<std::uint64_t>(kCoefficients[v & 3] * 2.0));
        out[3] = exact(41);
        out[4] = exact(kWords[v & 3]);
        out[5] = exact(static_cast<std::uint64_t>(static_cast<std::int64_t>(kMessage[v % 14])));
        out[6] = exact(static_cast<std::uint64_t>(std::int64_t{-7}));  // an int, sign-extended
        out[7] = exact(std::bit_cast<std::uint64_t>(2.5));
        out[8] = exact(static_cast<std::uint64_t>("xyz"[v % 3]));
        const float* vector = &vectors[i * 4];
        out[9] = exact(std::bit_cast<std::uint32_t>(vector[0] + vector[1] * 2 + vector[2] * 4 +
                                                    vector[3] * 8));
        out[10] = exact(static_cast<std::uint32_t>(static_cast<int>(narrow[2 * i])));
        out[11] = exact(static_cast<std::uint32_t>(static_cast<int>(narrow[2 * i + 1])));
        std::uint32_t group = 0;
        const std::size_t first = i - i % 8;
        for (std::size_t k = first; k < first + 8; ++k)
          group += static_cast<std::uint32_t>(in[k].a);
        out[12] = exact(group);
        out[13] = exact(4 + 6 * v);
        out[14] = exact((v >> (((v >> 3) & 7) * 4)) & 0xff);
        out[15] = exact(v + 1);
      });
}

std::uint32_t fibonacci(std::uint32_t k) {
  return k < 2 ? k : fibonacci(k - 1) + fibonacci(k - 2);
}

void controlReference(const std::vector<In>& in, std::size_t i, Expect* out) {
  const auto v = static_cast<std::uint32_t>(in[i].a);
  out[0] = exact(fibonacci(v % 16));
  const std::uint32_t operations[3] = {2 * v, v * v, 0u - v};
  out[1] = exact(operations[v % 3]);
  std::uint32_t switched = 0;
  switch (v % 7) {
    case 0:
      switched = 10;
      break;
    case 1:
      switched = v * 3;
      break;
    case 2:
      switched = v ^ 0x55;
      break;
    case 3:
      switched = 99;
      break;
    case 4:
      switched = v >> 1;
      break;
    case 5:
      switched = v + 5;
      break;
    default:
      switched = 7;
      break;
  }
  out[2] = exact(switched);
  std::uint32_t steps = 0;
  std::uint32_t x = v % 1000 + 1;
  while (x != 1) {
    x = (x & 1) ? 3 * x + 1 : x / 2;
    if (++steps > 1000) break;
  }
  out[3] = exact(steps);
  const std::uint32_t side = v % 100;
  out[4] = exact((v & 1) ? side * side : side * side / 2);
  out[5] = exact(1);
  out[6] = exact(1);
  out[7] = exact(1);
}

}  // namespace

int main(int argc, char** argv) {
  bool debug = false;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--debug") {
      debug = true;
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr, "usage: ptx_conformance [--debug] [--verbose]\n");
      return 2;
    }
  }
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  Runner runner;
  runner.verbose = verbose;
  CHECK(cuModuleLoadData(&runner.module, debug ? gpuproxy::testing::kConformanceDebugPtx
                                               : gpuproxy::testing::kConformancePtx));
  std::printf("PTX conformance (%s PTX)\n", debug ? "-G" : "optimised");
  std::mt19937_64 random(20261123);

  const std::vector<In> ints = pairs(intEdges(), random, 512, 0xffffffffull);
  runner.compare("int32", ints, runner.run("conf_int32", ints, oneDimensional(ints.size())),
                 int32Reference);
  std::vector<std::uint64_t> wideEdges;
  for (const std::uint32_t edge : intEdges()) {
    wideEdges.push_back(edge);
    wideEdges.push_back(std::uint64_t{edge} << 32 | edge);
  }
  wideEdges.push_back(0x8000000000000000ull);
  wideEdges.push_back(0x7fffffffffffffffull);
  const std::vector<In> longs = pairs(wideEdges, random, 512, ~0ull);
  runner.compare("int64", longs, runner.run("conf_int64", longs, oneDimensional(longs.size())),
                 int64Reference);
  const std::vector<In> floats = pairs(floatEdges(), random, 1024, 0xffffffffull);
  runner.compare("f32", floats, runner.run("conf_f32", floats, oneDimensional(floats.size())),
                 f32Reference);
  const std::vector<In> doubles = pairs(doubleEdges(), random, 512, ~0ull);
  runner.compare("f64", doubles, runner.run("conf_f64", doubles, oneDimensional(doubles.size())),
                 f64Reference);
  std::vector<In> conversions;
  {
    const std::vector<std::uint32_t> f = floatEdges();
    const std::vector<std::uint64_t> d = doubleEdges();
    const std::vector<std::uint32_t> k = intEdges();
    const std::uint64_t extraInts[] = {16777217ull,
                                       0xffffffffffffffffull,
                                       0x8000000000000001ull,
                                       0x7ffffffffffffc01ull,
                                       0x3c00ull,
                                       0x7bffull,
                                       0xfc00ull,
                                       0x7e00ull,
                                       0x0001ull,
                                       0x3f80ull,
                                       65504ull,
                                       65520ull};
    for (std::size_t i = 0; i < 600; ++i) {
      In row;
      row.a = i < f.size() * 4 ? f[i % f.size()] : (random() & 0xffffffffull);
      row.b = i < d.size() * 4 ? d[(i / 3) % d.size()] : random();
      if (i % 3 == 0)
        row.b = std::bit_cast<std::uint64_t>(static_cast<double>(f32(row.a)) * 1.0000001);
      row.c = i < std::size(extraInts) ? extraInts[i]
              : i < 100                ? k[i % k.size()]
                                       : random() >> (random() % 64);
      conversions.push_back(row);
    }
  }
  runner.compare("convert", conversions,
                 runner.run("conf_convert", conversions, oneDimensional(conversions.size())),
                 convertReference);
  std::vector<In> halves;
  {
    const std::uint16_t edges[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00,
                                   0x0001, 0x03ff, 0x0400, 0x7bff, 0x3800, 0x4200, 0xc500,
                                   0x3555, 0x5bf8, 0x1400, 0x3f80, 0x4049};
    for (const std::uint16_t a : edges) {
      for (const std::uint16_t b : edges) {
        halves.push_back(In{a, b, edges[(a + b) % std::size(edges)]});
      }
    }
    for (int k = 0; k < 512; ++k)
      halves.push_back(In{random() & 0xffff, random() & 0xffff, random() & 0xffff});
  }
  runner.compare("half", halves, runner.run("conf_half", halves, oneDimensional(halves.size())),
                 halfReference);
  std::vector<In> lanes(32 * 8);
  for (std::size_t k = 0; k < lanes.size(); ++k) {
    lanes[k].a = k < 32 ? 1000 + k % 3 : (k < 64 ? 5000 : random() % 100);
  }
  runner.compare("warp", lanes, runner.run("conf_warp", lanes, oneDimensional(lanes.size(), 64)),
                 warpReference);
  std::vector<In> blocks(kBlockThreads * 3);
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    blocks[k].a = k < kBlockThreads ? k % 9 : random() % 50 + 1;
  }
  Launch blockLaunch = oneDimensional(blocks.size(), kBlockThreads);
  blockLaunch.sharedBytes = kBlockThreads * 4;
  runner.compare("block", blocks, runner.run("conf_block", blocks, blockLaunch), blockReference);
  runner.compare(
      "early exit", blocks,
      runner.run("conf_early_exit", blocks, oneDimensional(blocks.size(), kBlockThreads)),
      earlyExitReference);
  Launch indexLaunch;
  indexLaunch.grid[0] = kIndexGrid.x;
  indexLaunch.grid[1] = kIndexGrid.y;
  indexLaunch.grid[2] = kIndexGrid.z;
  indexLaunch.block[0] = kIndexBlock.x;
  indexLaunch.block[1] = kIndexBlock.y;
  indexLaunch.block[2] = kIndexBlock.z;
  const std::vector<In> indexRows(kIndexGrid.x * kIndexGrid.y * kIndexGrid.z * kIndexBlock.x *
                                  kIndexBlock.y * kIndexBlock.z);
  runner.compare("indices", indexRows, runner.run("conf_indices", indexRows, indexLaunch),
                 indicesReference);
  runAtomics(runner, random);
  runMemory(runner, random);
  {
    // The SIMD and fp8 kernels are a module of their own, built for compute capability 9.0.
    CUmodule module = runner.module;
    CHECK(cuModuleLoadData(&runner.module, debug ? gpuproxy::testing::kConformanceSm90DebugPtx
                                                 : gpuproxy::testing::kConformanceSm90Ptx));
    const std::vector<In> simd = pairs(simdEdges(), random, 1024, 0xffffffffull);
    runner.compare("simd", simd, runner.run("conf_simd", simd, oneDimensional(simd.size())),
                   simdReference);
    std::vector<In> fp8 = pairs(fp8Edges(), random, 1024, 0xffffffffull);
    for (In& row : fp8) row.c = (row.c & 0xffff0000u) | ((row.a ^ row.b) & 0xffff);
    runner.compare("fp8", fp8, runner.run("conf_fp8", fp8, oneDimensional(fp8.size())),
                   fp8Reference);
    CHECK(cuModuleUnload(runner.module));
    runner.module = module;
  }
  std::vector<In> control(512);
  for (std::size_t k = 0; k < control.size(); ++k) control[k].a = k < 64 ? k : random() % 100000;
  runner.compare("control", control,
                 runner.run("conf_control", control, oneDimensional(control.size(), 64)),
                 controlReference);

  CHECK(cuModuleUnload(runner.module));
  CHECK(cuDevicePrimaryCtxRelease(device));
  if (runner.failures != 0) {
    std::printf("FAILED: %d of %llu results wrong\n", runner.failures,
                static_cast<unsigned long long>(runner.checked));
    return 1;
  }
  std::printf("PASSED: %llu results\n", static_cast<unsigned long long>(runner.checked));
  return 0;
}
