// cvt: conversions between every integer and float type, with PTX's rounding, saturation and
// NaN rules. Compiled with -frounding-math (int-to-float with a directed rounding mode).

#include <cmath>
#include <limits>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

// The conversion an instruction asks for, packed into its fields: width = destination type,
// vector = source type, immediate = rounding, flags = these bits.
constexpr std::uint8_t kCvtFtz = 1;
constexpr std::uint8_t kCvtSat = 2;
constexpr std::uint8_t kCvtIntegral = 4;
constexpr std::uint8_t kCvtRelu = 8;
constexpr std::uint8_t kCvtSatFinite = 16;

// An integer source's value.
std::int64_t signedValue(std::uint64_t bits, Type type) {
  switch (type) {
    case Type::kS8:
      return static_cast<std::int8_t>(bits);
    case Type::kS16:
      return static_cast<std::int16_t>(bits);
    case Type::kS32:
      return static_cast<std::int32_t>(bits);
    default:
      return static_cast<std::int64_t>(bits);
  }
}
std::uint64_t unsignedValue(std::uint64_t bits, Type type) {
  const unsigned bytes = typeBytes(type);
  return bytes >= 8 ? bits : bits & ((std::uint64_t{1} << (8 * bytes)) - 1);
}

// A float source's value (exact in a double).
double floatValue(std::uint64_t bits, Type type, bool ftz) {
  switch (type) {
    case Type::kF16:
      return fromHalf(static_cast<std::uint16_t>(bits));
    case Type::kBf16:
      return fromBfloat16(static_cast<std::uint16_t>(bits));
    case Type::kF32: {
      float value = as<float>(bits);
      if (ftz) value = flushSubnormal(value);
      return value;
    }
    default:
      return as<double>(bits);
  }
}

template <typename I>
std::uint64_t saturateInteger(__int128 value) {
  constexpr __int128 kMin = std::numeric_limits<I>::min();
  constexpr __int128 kMax = std::numeric_limits<I>::max();
  if (value < kMin) value = kMin;
  if (value > kMax) value = kMax;
  return bitsOf(static_cast<I>(value));
}

std::uint64_t toIntegerSaturated(__int128 value, Type destination) {
  switch (destination) {
    case Type::kS8:
      return saturateInteger<std::int8_t>(value);
    case Type::kS16:
      return saturateInteger<std::int16_t>(value);
    case Type::kS32:
      return saturateInteger<std::int32_t>(value);
    case Type::kS64:
      return saturateInteger<std::int64_t>(value);
    case Type::kU8:
      return saturateInteger<std::uint8_t>(value);
    case Type::kU16:
      return saturateInteger<std::uint16_t>(value);
    case Type::kU32:
      return saturateInteger<std::uint32_t>(value);
    default:
      return saturateInteger<std::uint64_t>(value);
  }
}

std::uint64_t floatToInteger(double value, Type destination, Rounding rounding) {
  switch (destination) {
    case Type::kS8:
      return bitsOf(floatToInt<std::int8_t>(value, rounding));
    case Type::kS16:
      return bitsOf(floatToInt<std::int16_t>(value, rounding));
    case Type::kS32:
      return bitsOf(floatToInt<std::int32_t>(value, rounding));
    case Type::kS64:
      return bitsOf(floatToInt<std::int64_t>(value, rounding));
    case Type::kU8:
      return bitsOf(floatToInt<std::uint8_t>(value, rounding));
    case Type::kU16:
      return bitsOf(floatToInt<std::uint16_t>(value, rounding));
    case Type::kU32:
      return bitsOf(floatToInt<std::uint32_t>(value, rounding));
    default:
      return bitsOf(floatToInt<std::uint64_t>(value, rounding));
  }
}

// A value (exact, in a double) as a float type, rounded as asked.
std::uint64_t toFloatBits(double value, Type destination, Rounding rounding, std::uint8_t flags) {
  if ((flags & kCvtRelu) != 0 && value < 0) value = 0;
  switch (destination) {
    case Type::kF16:
      return toHalf(value, rounding, (flags & kCvtSatFinite) != 0);
    case Type::kBf16:
      return toBfloat16(value, rounding);
    case Type::kTf32:
      return toTf32(static_cast<float>(value), rounding);
    case Type::kF32: {
      float out = roundToFloat(value, rounding);
      if ((flags & kCvtFtz) != 0) out = flushSubnormal(out);
      if ((flags & kCvtSat) != 0) out = saturateUnit(out);
      return bitsOf(canonical(out));
    }
    default: {
      double out = value;
      if ((flags & kCvtSat) != 0) out = saturateUnit(out);
      return bitsOf(canonical(out));
    }
  }
}

std::uint64_t convert(std::uint64_t bits, Type destination, Type source, Rounding rounding,
                      std::uint8_t flags) {
  const bool floatSource = isFloat(source);
  const bool floatDestination = isFloat(destination);
  if (!floatSource && !floatDestination) {
    const __int128 value = isSigned(source) ? __int128{signedValue(bits, source)}
                                            : __int128{unsignedValue(bits, source)};
    if ((flags & kCvtSat) != 0) return toIntegerSaturated(value, destination);
    // Truncation to the destination, then extension by the destination's signedness.
    const unsigned bytes = typeBytes(destination);
    const auto raw = static_cast<std::uint64_t>(value);
    if (bytes >= 8) return raw;
    const std::uint64_t low = raw & ((std::uint64_t{1} << (8 * bytes)) - 1);
    return isSigned(destination) ? static_cast<std::uint64_t>(signedValue(low, destination)) : low;
  }
  if (floatSource && !floatDestination) {
    return floatToInteger(floatValue(bits, source, (flags & kCvtFtz) != 0), destination, rounding);
  }
  if (!floatSource) {
    // Integer to float: exact in a double up to 2^53; beyond, the host converts with the
    // rounding mode set.
    if (destination == Type::kF32 || destination == Type::kF64) {
      const int saved = std::fegetround();
      std::fesetround(fenvRounding(rounding));
      std::uint64_t out = 0;
      if (destination == Type::kF32) {
        volatile float value = isSigned(source) ? static_cast<float>(signedValue(bits, source))
                                                : static_cast<float>(unsignedValue(bits, source));
        out = toFloatBits(static_cast<double>(value), destination, Rounding::kNearest, flags);
      } else {
        volatile double value = isSigned(source) ? static_cast<double>(signedValue(bits, source))
                                                 : static_cast<double>(unsignedValue(bits, source));
        out = toFloatBits(value, destination, Rounding::kNearest, flags);
      }
      std::fesetround(saved);
      return out;
    }
    const double value = isSigned(source) ? static_cast<double>(signedValue(bits, source))
                                          : static_cast<double>(unsignedValue(bits, source));
    return toFloatBits(value, destination, rounding, flags);
  }
  double value = floatValue(bits, source, (flags & kCvtFtz) != 0);
  if ((flags & kCvtIntegral) != 0) value = roundIntegral(value, rounding);
  return toFloatBits(value, destination,
                     (flags & kCvtIntegral) != 0 ? Rounding::kNearest : rounding, flags);
}

bool convertHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const auto destination = static_cast<Type>(instruction.width);
  const auto source = static_cast<Type>(instruction.vector);
  const auto rounding = static_cast<Rounding>(instruction.immediate);
  const std::uint8_t flags = instruction.flags;
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = convert(a[lane], destination, source, rounding, flags);
  });
  return true;
}

// Integer to integer without saturation: truncate or extend, the common case in addressing.
template <typename D, typename S>
struct IntegerCast {
  static D apply(S value) { return static_cast<D>(value); }
};

// Two values into one packed register: d = {convert(a) high, convert(b) low}.
bool packHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const auto destination = static_cast<Type>(instruction.width);
  const auto source = static_cast<Type>(instruction.vector);
  const auto rounding = static_cast<Rounding>(instruction.immediate);
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint64_t high = convert(a[lane], destination, source, rounding, instruction.flags);
    const std::uint64_t low = convert(b[lane], destination, source, rounding, instruction.flags);
    d[lane] = ((high & 0xffff) << 16) | (low & 0xffff);
  });
  return true;
}

// fp8 pairs (cvt .e4m3x2/.e5m2x2; Instruction::flags bit 0: e5m2, bit 1: .relu). In a pair the
// first source, or the upper half of an f16x2 source, is the upper byte, and the other way round.
constexpr std::uint8_t kFp8E5m2 = 1;
constexpr std::uint8_t kFp8Relu = 2;

std::uint8_t toFp8(double value, std::uint8_t flags) {
  if ((flags & kFp8Relu) != 0 && value < 0) value = 0;
  return (flags & kFp8E5m2) != 0 ? toE5m2(value) : toE4m3(value);
}

// cvt.rn.satfinite{.relu}.f8x2.f32 d, a, b: d = {fp8(a), fp8(b)}.
bool fp8FromFloatsHandler(ExecContext& context, const Instruction& instruction,
                          std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  forLanes(mask, [&](std::uint32_t lane) {
    const auto high =
        toFp8(std::bit_cast<float>(static_cast<std::uint32_t>(a[lane])), instruction.flags);
    const auto low =
        toFp8(std::bit_cast<float>(static_cast<std::uint32_t>(b[lane])), instruction.flags);
    d[lane] = (std::uint64_t{high} << 8) | low;
  });
  return true;
}

// cvt.rn.satfinite{.relu}.f8x2.f16x2 d, a.
bool fp8FromHalvesHandler(ExecContext& context, const Instruction& instruction,
                          std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  forLanes(mask, [&](std::uint32_t lane) {
    const auto high = toFp8(fromHalf(static_cast<std::uint16_t>(a[lane] >> 16)), instruction.flags);
    const auto low = toFp8(fromHalf(static_cast<std::uint16_t>(a[lane])), instruction.flags);
    d[lane] = (std::uint64_t{high} << 8) | low;
  });
  return true;
}

// cvt.rn{.relu}.f16x2.f8x2 d, a: both bytes of a, exactly, as halves.
bool halvesFromFp8Handler(ExecContext& context, const Instruction& instruction,
                          std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  auto half = [&](std::uint8_t bits) {
    double value = (instruction.flags & kFp8E5m2) != 0 ? fromE5m2(bits) : fromE4m3(bits);
    if ((instruction.flags & kFp8Relu) != 0 && value < 0) value = 0;
    return std::uint64_t{toHalf(value)};
  };
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = (half(static_cast<std::uint8_t>(a[lane] >> 8)) << 16) |
              half(static_cast<std::uint8_t>(a[lane]));
  });
  return true;
}

// cvt between fp8 pairs and f32 or f16x2 (compute capability 8.9).
bool bindFp8Convert(const ParsedInstruction& parsed, std::string_view fp8, Rounding rounding,
                    bool relu, bool satFinite, const std::vector<Type>& types,
                    OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const std::string_view opcode = parsed.opcode;
  const bool fromFp8 = opcode.substr(opcode.size() - fp8.size()) == fp8;
  if (types.size() != 1) return bindError(resolver, "cvt needs two types");
  if (rounding != Rounding::kNearest) return bindError(resolver, "fp8 conversions need .rn");
  instruction.flags =
      static_cast<std::uint8_t>((fp8 == "e5m2x2" ? kFp8E5m2 : 0) | (relu ? kFp8Relu : 0));
  const std::vector<Operand>& operands = parsed.operands;
  if (fromFp8) {
    if (types[0] != Type::kF16x2)
      return unsupportedBinding(resolver, unsupported, "this conversion");
    if (satFinite) return bindError(resolver, ".satfinite converting from fp8");
    if (!expectOperands(parsed, 2, resolver) ||
        !bindDestination(instruction, 0, operands[0], Type::kF16x2, resolver) ||
        !bindSource(instruction, 1, operands[1], Type::kB16, resolver)) {
      return false;
    }
    instruction.handler = &halvesFromFp8Handler;
    return true;
  }
  if (!satFinite) return bindError(resolver, "converting to fp8 needs .satfinite");
  if (types[0] == Type::kF32) {
    if (!expectOperands(parsed, 3, resolver) ||
        !bindDestination(instruction, 0, operands[0], Type::kB16, resolver) ||
        !bindSource(instruction, 1, operands[1], Type::kF32, resolver) ||
        !bindSource(instruction, 2, operands[2], Type::kF32, resolver)) {
      return false;
    }
    instruction.handler = &fp8FromFloatsHandler;
    return true;
  }
  if (types[0] != Type::kF16x2) return unsupportedBinding(resolver, unsupported, "this conversion");
  if (!expectOperands(parsed, 2, resolver) ||
      !bindDestination(instruction, 0, operands[0], Type::kB16, resolver) ||
      !bindSource(instruction, 1, operands[1], Type::kF16x2, resolver)) {
    return false;
  }
  instruction.handler = &fp8FromHalvesHandler;
  return true;
}

template <typename D>
Handler castFrom(Type source) {
  switch (source) {
    case Type::kU8:
      return &unaryHandler<std::uint8_t, IntegerCast<D, std::uint8_t>>;
    case Type::kS8:
      return &unaryHandler<std::int8_t, IntegerCast<D, std::int8_t>>;
    case Type::kU16:
    case Type::kB16:
      return &unaryHandler<std::uint16_t, IntegerCast<D, std::uint16_t>>;
    case Type::kS16:
      return &unaryHandler<std::int16_t, IntegerCast<D, std::int16_t>>;
    case Type::kU32:
    case Type::kB32:
      return &unaryHandler<std::uint32_t, IntegerCast<D, std::uint32_t>>;
    case Type::kS32:
      return &unaryHandler<std::int32_t, IntegerCast<D, std::int32_t>>;
    case Type::kU64:
    case Type::kB64:
      return &unaryHandler<std::uint64_t, IntegerCast<D, std::uint64_t>>;
    case Type::kS64:
      return &unaryHandler<std::int64_t, IntegerCast<D, std::int64_t>>;
    default:
      return nullptr;
  }
}

Handler integerCast(Type destination, Type source) {
  switch (destination) {
    case Type::kU8:
      return castFrom<std::uint8_t>(source);
    case Type::kS8:
      return castFrom<std::int8_t>(source);
    case Type::kU16:
    case Type::kB16:
      return castFrom<std::uint16_t>(source);
    case Type::kS16:
      return castFrom<std::int16_t>(source);
    case Type::kU32:
    case Type::kB32:
      return castFrom<std::uint32_t>(source);
    case Type::kS32:
      return castFrom<std::int32_t>(source);
    case Type::kU64:
    case Type::kB64:
      return castFrom<std::uint64_t>(source);
    case Type::kS64:
      return castFrom<std::int64_t>(source);
    default:
      return nullptr;
  }
}

}  // namespace

bool bindConvert(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported) {
  bool integral = false;
  const Rounding rounding = qualifiers.takeRounding(integral);
  const bool ftz = qualifiers.take("ftz");
  const bool sat = qualifiers.take("sat");
  const bool relu = qualifiers.take("relu");
  const bool satFinite = qualifiers.take("satfinite");
  const std::string_view fp8 = qualifiers.takeAny({"e4m3x2", "e5m2x2"});
  const std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (!fp8.empty()) {
    return bindFp8Convert(parsed, fp8, rounding, relu, satFinite, types, resolver, instruction,
                          unsupported);
  }
  if (types.size() != 2) return bindError(resolver, "cvt needs two types");
  const Type destination = types[0];
  const Type source = types[1];
  if (destination == Type::kPred || source == Type::kPred || destination == Type::kB128 ||
      source == Type::kB128) {
    return bindError(resolver, "cvt of this type");
  }
  const bool packed = destination == Type::kF16x2 || destination == Type::kBf16x2;
  if ((source == Type::kF16x2 || source == Type::kBf16x2 || source == Type::kTf32) ||
      (destination == Type::kTf32 && rounding != Rounding::kNearestAway &&
       rounding != Rounding::kZero && rounding != Rounding::kNearest)) {
    return unsupportedBinding(resolver, unsupported, "this conversion");
  }
  if (integral && !isFloat(source)) {
    return bindError(resolver, "integer rounding needs a float source");
  }
  instruction.width = static_cast<std::uint8_t>(
      packed ? (destination == Type::kF16x2 ? Type::kF16 : Type::kBf16) : destination);
  instruction.vector = static_cast<std::uint8_t>(source);
  instruction.immediate = static_cast<std::int64_t>(rounding);
  instruction.flags = static_cast<std::uint8_t>(
      (ftz ? kCvtFtz : 0) | (sat ? kCvtSat : 0) | (integral ? kCvtIntegral : 0) |
      (relu ? kCvtRelu : 0) | (satFinite ? kCvtSatFinite : 0));
  const std::vector<Operand>& operands = parsed.operands;
  if (packed) {
    if (source != Type::kF32) return unsupportedBinding(resolver, unsupported, "this packing");
    if (!expectOperands(parsed, 3, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], destination, resolver) ||
        !bindSource(instruction, 1, operands[1], source, resolver) ||
        !bindSource(instruction, 2, operands[2], source, resolver)) {
      return false;
    }
    instruction.handler = &packHandler;
    return true;
  }
  if (!expectOperands(parsed, 2, resolver)) return false;
  if (!bindDestination(instruction, 0, operands[0], destination, resolver) ||
      !bindSource(instruction, 1, operands[1], source, resolver)) {
    return false;
  }
  if (isInteger(destination) && isInteger(source) && !sat) {
    instruction.handler = integerCast(destination, source);
    if (instruction.handler != nullptr) return true;
  }
  instruction.handler = &convertHandler;
  return true;
}

}  // namespace gpuproxy::server::ptx
