#pragma once
// Number formats and conversions the way PTX defines them and C++ does not say: IEEE half and
// bfloat16 with every rounding mode, float-to-integer conversions that saturate (NaN gives 0),
// flush-to-zero, and the GPU's canonical NaN.

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace gpuproxy::server::ptx {

// PTX rounding modifiers.
enum class Rounding : std::uint8_t {
  kDefault,     // none written: the instruction's own default
  kNearest,     // .rn / .rni
  kZero,        // .rz / .rzi
  kDown,        // .rm / .rmi
  kUp,          // .rp / .rpi
  kNearestAway  // .rna (cvt to tf32 only)
};

inline int fenvRounding(Rounding rounding) {
  switch (rounding) {
    case Rounding::kZero:
      return FE_TOWARDZERO;
    case Rounding::kDown:
      return FE_DOWNWARD;
    case Rounding::kUp:
      return FE_UPWARD;
    default:
      return FE_TONEAREST;
  }
}

// The NaN every f32 arithmetic instruction returns on a GPU.
inline constexpr std::uint32_t kCanonicalNanF32 = 0x7fffffffu;
inline constexpr std::uint64_t kCanonicalNanF64 = 0x7fffffffffffffffull;
inline constexpr std::uint16_t kCanonicalNanF16 = 0x7fffu;
inline constexpr std::uint16_t kCanonicalNanBf16 = 0x7fffu;

inline float canonical(float value) {
  return std::isnan(value) ? std::bit_cast<float>(kCanonicalNanF32) : value;
}
inline double canonical(double value) {
  return std::isnan(value) ? std::bit_cast<double>(kCanonicalNanF64) : value;
}

// Subnormals to zero of the same sign (.ftz).
inline float flushSubnormal(float value) {
  return std::fpclassify(value) == FP_SUBNORMAL ? std::copysign(0.0f, value) : value;
}
inline double flushSubnormal(double value) {
  return std::fpclassify(value) == FP_SUBNORMAL ? std::copysign(0.0, value) : value;
}

// .sat for floats: clamp to [0, 1], NaN to 0.
template <typename F>
F saturateUnit(F value) {
  if (std::isnan(value)) return F(0);
  if (value < F(0)) return F(0);  // -0.0 stays -0.0? PTX: result is +0.0
  if (value > F(1)) return F(1);
  return value == F(0) ? F(0) : value;
}

// Rounds a double to a float with the given rounding mode, exactly (no double rounding: a double
// holds every float exactly and the conversion is one IEEE operation).
inline float roundToFloat(double value, Rounding rounding) {
  if (rounding == Rounding::kDefault || rounding == Rounding::kNearest) {
    return static_cast<float>(value);
  }
  const int saved = std::fegetround();
  std::fesetround(fenvRounding(rounding));
  volatile double in = value;
  // Volatile, or the compiler may convert after the mode is restored.
  volatile float out = static_cast<float>(in);
  std::fesetround(saved);
  return out;
}

// Rounds a value to an integral value of the same type (cvt.rni/rzi/rmi/rpi .f32.f32).
template <typename F>
F roundIntegral(F value, Rounding rounding) {
  switch (rounding) {
    case Rounding::kZero:
      return std::trunc(value);
    case Rounding::kDown:
      return std::floor(value);
    case Rounding::kUp:
      return std::ceil(value);
    default:
      return std::nearbyint(value);  // the default environment rounds to nearest even
  }
}

// Float to integer as cvt does: rounded as asked (default: toward zero, as cvt.rzi), saturated to
// the integer's range, NaN to 0.
template <typename I, typename F>
I floatToInt(F value, Rounding rounding) {
  if (std::isnan(value)) return 0;
  const F rounded =
      roundIntegral(value, rounding == Rounding::kDefault ? Rounding::kZero : rounding);
  constexpr I kMin = std::numeric_limits<I>::min();
  constexpr I kMax = std::numeric_limits<I>::max();
  // Compare in long double so that the bounds are exact for 64-bit integers too.
  const long double wide = static_cast<long double>(rounded);
  if (wide <= static_cast<long double>(kMin)) return kMin;
  if (wide >= static_cast<long double>(kMax)) return kMax;
  return static_cast<I>(rounded);
}

// Integer to float with a rounding mode (large 64-bit integers are not exact in a float).
template <typename F, typename I>
F intToFloat(I value, Rounding rounding) {
  if (rounding == Rounding::kDefault || rounding == Rounding::kNearest) {
    return static_cast<F>(value);
  }
  const int saved = std::fegetround();
  std::fesetround(fenvRounding(rounding));
  volatile I in = value;
  volatile F out = static_cast<F>(in);
  std::fesetround(saved);
  return out;
}

// ---- IEEE binary16 ------------------------------------------------------------------------

// Rounds the magnitude `mantissa` (an integer with `shift` extra low bits) right by `shift` bits.
inline std::uint64_t roundShift(std::uint64_t mantissa, unsigned shift, bool negative,
                                Rounding rounding) {
  if (shift == 0) return mantissa;
  if (shift >= 64) {
    const bool nonzero = mantissa != 0;
    switch (rounding) {
      case Rounding::kUp:
        return (!negative && nonzero) ? 1 : 0;
      case Rounding::kDown:
        return (negative && nonzero) ? 1 : 0;
      default:
        return 0;
    }
  }
  const std::uint64_t kept = mantissa >> shift;
  const std::uint64_t rest = mantissa & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  switch (rounding) {
    case Rounding::kZero:
      return kept;
    case Rounding::kUp:
      return kept + ((!negative && rest != 0) ? 1 : 0);
    case Rounding::kDown:
      return kept + ((negative && rest != 0) ? 1 : 0);
    case Rounding::kNearestAway:
      return kept + (rest >= half ? 1 : 0);
    default:
      return kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
  }
}

// A double to a narrow IEEE format with `exponentBits` and `mantissaBits` (f16: 5/10, bf16: 8/7),
// rounded as asked, with subnormals, infinities and NaN (canonical `nan`).
inline std::uint16_t doubleToNarrow(double value, Rounding rounding, unsigned exponentBits,
                                    unsigned mantissaBits, std::uint16_t nan, bool saturateFinite) {
  if (rounding == Rounding::kDefault) rounding = Rounding::kNearest;
  const std::uint16_t signBit = static_cast<std::uint16_t>(1u << (exponentBits + mantissaBits));
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(value);
  const bool negative = (bits >> 63) != 0;
  const std::uint16_t sign = negative ? signBit : 0;
  const int bias = (1 << (exponentBits - 1)) - 1;
  const std::uint16_t infinity =
      static_cast<std::uint16_t>(((1u << exponentBits) - 1) << mantissaBits);
  const std::uint16_t maxFinite = static_cast<std::uint16_t>(infinity - 1);
  if (std::isnan(value)) return nan;
  if (std::isinf(value))
    return static_cast<std::uint16_t>(sign | (saturateFinite ? maxFinite : infinity));
  if (value == 0) return sign;
  int exponent = 0;
  const double fraction = std::frexp(std::fabs(value), &exponent);  // [0.5, 1) * 2^exponent
  // As an integer mantissa with 53 significant bits: value = m * 2^(exponent - 53).
  const auto m = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
  // Target: normal numbers have value = (1.f) * 2^e with e = exponent - 1.
  const int e = exponent - 1;
  const int minNormal = 1 - bias;
  std::uint64_t result = 0;
  if (e >= minNormal) {
    // Keep mantissaBits + 1 significant bits.
    const unsigned shift = 53 - (mantissaBits + 1);
    std::uint64_t kept = roundShift(m, shift, negative, rounding);
    int biased = e + bias;
    if (kept >> (mantissaBits + 1)) {  // rounding carried into a new bit
      kept >>= 1;
      ++biased;
    }
    if (biased >= (1 << exponentBits) - 1) {
      // Overflow: infinity, or the largest finite value for modes rounding toward zero.
      const bool toInfinity =
          rounding == Rounding::kNearest || rounding == Rounding::kNearestAway ||
          (rounding == Rounding::kUp && !negative) || (rounding == Rounding::kDown && negative);
      return static_cast<std::uint16_t>(sign |
                                        ((toInfinity && !saturateFinite) ? infinity : maxFinite));
    }
    result = (static_cast<std::uint64_t>(biased) << mantissaBits) |
             (kept & ((std::uint64_t{1} << mantissaBits) - 1));
  } else {
    // Subnormal: value = k * 2^(minNormal - mantissaBits).
    const int shift = (minNormal - static_cast<int>(mantissaBits)) - (exponent - 53);
    const std::uint64_t kept = roundShift(m, static_cast<unsigned>(shift), negative, rounding);
    result = kept;  // may round up into the smallest normal, which the encoding handles
  }
  return static_cast<std::uint16_t>(sign | result);
}

inline double narrowToDouble(std::uint16_t bits, unsigned exponentBits, unsigned mantissaBits) {
  const bool negative = (bits >> (exponentBits + mantissaBits)) & 1;
  const unsigned exponent = (bits >> mantissaBits) & ((1u << exponentBits) - 1);
  const unsigned mantissa = bits & ((1u << mantissaBits) - 1);
  const int bias = (1 << (exponentBits - 1)) - 1;
  double value = 0;
  if (exponent == (1u << exponentBits) - 1) {
    value = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                          : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<double>(mantissa), 1 - bias - static_cast<int>(mantissaBits));
  } else {
    value = std::ldexp(static_cast<double>(mantissa | (1u << mantissaBits)),
                       static_cast<int>(exponent) - bias - static_cast<int>(mantissaBits));
  }
  return negative ? -value : value;
}

inline std::uint16_t toHalf(double value, Rounding rounding = Rounding::kNearest,
                            bool saturateFinite = false) {
  return doubleToNarrow(value, rounding, 5, 10, kCanonicalNanF16, saturateFinite);
}
inline double fromHalf(std::uint16_t bits) {
  return narrowToDouble(bits, 5, 10);
}
inline std::uint16_t toBfloat16(double value, Rounding rounding = Rounding::kNearest) {
  return doubleToNarrow(value, rounding, 8, 7, kCanonicalNanBf16, false);
}
inline double fromBfloat16(std::uint16_t bits) {
  return narrowToDouble(bits, 8, 7);
}

// fp8 (cvt's .e4m3x2 and .e5m2x2 halves), always rounded to nearest even and saturated to the
// largest finite value (.satfinite, which PTX requires for these conversions); NaN becomes
// 0x7f (with its sign cleared). E4M3 has no infinities: its largest value is 448 and
// S.1111.111 is NaN. E5M2 is IEEE-like with a 5-bit exponent.
inline std::uint8_t toE4m3(double value) {
  if (std::isnan(value)) return 0x7f;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return sign;
  if (std::isinf(magnitude) || magnitude >= 464) return sign | 0x7e;  // 464: halfway to 480
  int exponent = 0;
  std::frexp(magnitude, &exponent);
  const int e = std::max(exponent - 1, -6);  // below 2^-6: subnormal, quantum 2^-9
  const double quanta = std::ldexp(magnitude, 3 - e);
  double whole = std::floor(quanta);
  const double rest = quanta - whole;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(whole, 2.0) != 0)) whole += 1;
  auto q = static_cast<unsigned>(whole);  // 8..16 for normals, 0..8 for subnormals
  int biased = e + 7;
  if (q >= 16) {
    q /= 2;
    ++biased;
  }
  if (q < 8) return static_cast<std::uint8_t>(sign | q);  // subnormal (or zero)
  if (biased > 15 || (biased == 15 && q - 8 == 7)) return sign | 0x7e;
  return static_cast<std::uint8_t>(sign | (biased << 3) | (q - 8));
}
inline double fromE4m3(std::uint8_t bits) {
  const unsigned exponent = (bits >> 3) & 0xf;
  const unsigned mantissa = bits & 7;
  double value = 0;
  if (exponent == 15 && mantissa == 7) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<double>(mantissa), -9);
  } else {
    value = std::ldexp(static_cast<double>(mantissa | 8), static_cast<int>(exponent) - 10);
  }
  return (bits & 0x80) != 0 ? -value : value;
}
inline std::uint8_t toE5m2(double value) {
  return static_cast<std::uint8_t>(doubleToNarrow(value, Rounding::kNearest, 5, 2, 0x7f, true));
}
inline double fromE5m2(std::uint8_t bits) {
  return narrowToDouble(bits, 5, 2);
}

// A float rounded to tf32 (10 mantissa bits, float's exponent), kept in a float's bits.
inline std::uint32_t toTf32(float value, Rounding rounding) {
  if (std::isnan(value)) return kCanonicalNanF32;
  if (std::isinf(value) || value == 0) return std::bit_cast<std::uint32_t>(value);
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const bool negative = (bits >> 31) != 0;
  std::uint64_t magnitude = bits & 0x7fffffffu;
  magnitude = roundShift(magnitude, 13, negative, rounding) << 13;
  return static_cast<std::uint32_t>(magnitude) | (negative ? 0x80000000u : 0);
}

}  // namespace gpuproxy::server::ptx
