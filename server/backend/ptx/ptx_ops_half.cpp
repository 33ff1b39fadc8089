// f16, bf16 and their packed x2 forms. Each operation is computed on the exact values (in a
// double, which holds any product or sum of two halves exactly) and rounded once to the format,
// as the GPU's half units do.

#include <cmath>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

constexpr std::uint8_t kHalfFtz = 1;
constexpr std::uint8_t kHalfSat = 2;
constexpr std::uint8_t kHalfRelu = 4;
constexpr std::uint8_t kHalfNan = 8;  // min/max .NaN

template <bool Bf16>
double decode(std::uint16_t bits, std::uint8_t flags) {
  double value = Bf16 ? fromBfloat16(bits) : fromHalf(bits);
  if ((flags & kHalfFtz) != 0) {
    const double smallest = Bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -14);
    if (value != 0 && std::fabs(value) < smallest) value = std::copysign(0.0, value);
  }
  return value;
}

template <bool Bf16>
std::uint16_t encode(double value, std::uint8_t flags) {
  if ((flags & kHalfSat) != 0) value = saturateUnit(value);
  if ((flags & kHalfRelu) != 0 && value < 0) value = 0;
  std::uint16_t bits = Bf16 ? toBfloat16(value) : toHalf(value);
  if ((flags & kHalfFtz) != 0) {
    const std::uint16_t exponentMask = Bf16 ? 0x7f80 : 0x7c00;
    if ((bits & exponentMask) == 0) bits &= 0x8000;  // a subnormal result flushed to zero
  }
  return bits;
}

struct HAdd {
  static double apply(double a, double b, double) { return a + b; }
};
struct HSub {
  static double apply(double a, double b, double) { return a - b; }
};
struct HMul {
  static double apply(double a, double b, double) { return a * b; }
};
struct HFma {
  static double apply(double a, double b, double c) { return std::fma(a, b, c); }
};
struct HMin {
  static double apply(double a, double b, double nanFlag) {
    if (std::isnan(a) || std::isnan(b)) {
      if (nanFlag != 0 || (std::isnan(a) && std::isnan(b))) return std::nan("");
      return std::isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) return std::signbit(a) ? a : b;
    return a < b ? a : b;
  }
};
struct HMax {
  static double apply(double a, double b, double nanFlag) {
    if (std::isnan(a) || std::isnan(b)) {
      if (nanFlag != 0 || (std::isnan(a) && std::isnan(b))) return std::nan("");
      return std::isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) return std::signbit(a) ? b : a;
    return a > b ? a : b;
  }
};
struct HEx2 {
  static double apply(double a, double, double) { return std::exp2(a); }
};
struct HTanh {
  static double apply(double a, double, double) { return std::tanh(a); }
};

// op[1..3] are the sources (op[2], op[3] absent for unary operations: their rows are unused).
template <bool Bf16, bool Packed, typename Op, int Sources>
bool halfHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = Sources >= 2 ? context.row(instruction.op[2]) : a;
  const std::uint64_t* c = Sources >= 3 ? context.row(instruction.op[3]) : a;
  const std::uint8_t flags = instruction.flags;
  const double nanFlag = (flags & kHalfNan) != 0 ? 1 : 0;
  forLanes(mask, [&](std::uint32_t lane) {
    std::uint64_t out = 0;
    for (unsigned part = 0; part < (Packed ? 2u : 1u); ++part) {
      const unsigned shift = 16 * part;
      const double x = decode<Bf16>(static_cast<std::uint16_t>(a[lane] >> shift), flags);
      const double y =
          Sources >= 2 ? decode<Bf16>(static_cast<std::uint16_t>(b[lane] >> shift), flags) : 0;
      const double z = Sources >= 3
                           ? decode<Bf16>(static_cast<std::uint16_t>(c[lane] >> shift), flags)
                           : nanFlag;
      out |= std::uint64_t{encode<Bf16>(Op::apply(x, y, z), flags)} << shift;
    }
    d[lane] = out;
  });
  return true;
}

// neg and abs flip or clear the sign bit of each half.
template <bool Packed, bool Negate>
bool halfSignHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t signs = Packed ? 0x80008000u : 0x8000u;
  const std::uint64_t bits = Packed ? 0xffffffffu : 0xffffu;
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = Negate ? ((a[lane] ^ signs) & bits) : (a[lane] & bits & ~signs);
  });
  return true;
}

// The comparisons in the order setp and set name them: eq ne lt le gt ge, their unordered "u"
// forms, num, nan.
bool compareHalves(unsigned cmp, double x, double y) {
  const bool unordered = std::isnan(x) || std::isnan(y);
  switch (cmp) {
    case 0:
      return !unordered && x == y;
    case 1:
      return !unordered && x != y;
    case 2:
      return !unordered && x < y;
    case 3:
      return !unordered && x <= y;
    case 4:
      return !unordered && x > y;
    case 5:
      return !unordered && x >= y;
    case 6:
      return unordered || x == y;
    case 7:
      return unordered || x != y;
    case 8:
      return unordered || x < y;
    case 9:
      return unordered || x <= y;
    case 10:
      return unordered || x > y;
    case 11:
      return unordered || x >= y;
    case 12:
      return !unordered;
    default:
      return unordered;
  }
}

// setp on halves: op[0] the predicate of the low half, op[4] of the high half (x2 forms) or the
// complement (scalar d|q form). flags bits 0-2 as compareHandler; the comparison in `extra`.
template <bool Bf16, bool Packed>
bool halfCompareHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const unsigned cmp = instruction.extra;
  const unsigned combine = instruction.flags & 3;
  std::uint32_t other = combine != 0 ? context.preds[instruction.op[3]] : 0;
  if ((instruction.flags & 4) != 0) other = ~other;
  const std::uint8_t ftzFlag = (instruction.flags & 8) != 0 ? kHalfFtz : 0;
  auto compare = [&](double x, double y) { return compareHalves(cmp, x, y); };
  ;
  auto combined = [&](bool value, std::uint32_t lane) {
    const bool c = ((other >> lane) & 1) != 0;
    if (combine == 1) return value && c;
    if (combine == 2) return value || c;
    if (combine == 3) return value != c;
    return value;
  };
  std::uint32_t low = 0;
  std::uint32_t high = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    for (unsigned part = 0; part < (Packed ? 2u : 1u); ++part) {
      const unsigned shift = 16 * part;
      const double x = decode<Bf16>(static_cast<std::uint16_t>(a[lane] >> shift), ftzFlag);
      const double y = decode<Bf16>(static_cast<std::uint16_t>(b[lane] >> shift), ftzFlag);
      const bool value = compare(x, y);
      if (part == 0) {
        low |= static_cast<std::uint32_t>(combined(value, lane)) << lane;
        if (!Packed) high |= static_cast<std::uint32_t>(combined(!value, lane)) << lane;
      } else {
        high |= static_cast<std::uint32_t>(combined(value, lane)) << lane;
      }
    }
  });
  std::uint32_t& p = context.preds[instruction.op[0]];
  p = (p & ~mask) | (low & mask);
  if (instruction.op[4] != kNoRegister) {
    std::uint32_t& q = context.preds[instruction.op[4]];
    q = (q & ~mask) | (high & mask);
  }
  return true;
}

// set on halves: each half of the result is the comparison as a half (1.0 or 0.0; `extra` bit
// 8 clear) or as an integer mask (all ones or 0; bit 8 set; bit 9: one 32-bit mask for a scalar
// source), written to the halves of the result. flags bits 0-2 combine as compareHandler; bit 3
// .ftz.
template <bool Bf16, bool Packed>
bool halfSetHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const unsigned cmp = instruction.extra & 0xff;
  const bool integerResult = (instruction.extra & 0x100) != 0;
  const bool wideResult = (instruction.extra & 0x200) != 0;
  const unsigned combine = instruction.flags & 3;
  std::uint32_t other = combine != 0 ? context.preds[instruction.op[3]] : 0;
  if ((instruction.flags & 4) != 0) other = ~other;
  const std::uint8_t ftzFlag = (instruction.flags & 8) != 0 ? kHalfFtz : 0;
  const std::uint16_t one = Bf16 ? 0x3f80 : 0x3c00;
  forLanes(mask, [&](std::uint32_t lane) {
    std::uint64_t result = 0;
    for (unsigned part = 0; part < (Packed ? 2u : 1u); ++part) {
      const unsigned shift = 16 * part;
      const double x = decode<Bf16>(static_cast<std::uint16_t>(a[lane] >> shift), ftzFlag);
      const double y = decode<Bf16>(static_cast<std::uint16_t>(b[lane] >> shift), ftzFlag);
      bool value = compareHalves(cmp, x, y);
      const bool c = ((other >> lane) & 1) != 0;
      if (combine == 1) value = value && c;
      if (combine == 2) value = value || c;
      if (combine == 3) value = value != c;
      std::uint64_t bits = 0;
      if (integerResult) {
        bits = value ? (Packed || !wideResult ? 0xffffu : 0xffffffffu) : 0;
      } else {
        bits = value ? one : 0;
      }
      result |= bits << shift;
    }
    d[lane] = result;
  });
  return true;
}

template <typename Op, int Sources>
Handler halfFor(bool bf16, bool packed) {
  if (bf16)
    return packed ? &halfHandler<true, true, Op, Sources> : &halfHandler<true, false, Op, Sources>;
  return packed ? &halfHandler<false, true, Op, Sources> : &halfHandler<false, false, Op, Sources>;
}

}  // namespace

bool bindHalf(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  std::string_view cmp;
  if (base == "setp" || base == "set") {
    cmp = qualifiers.takeAny({"eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu",
                              "geu", "num", "nan"});
    if (cmp.empty()) return bindError(resolver, "missing comparison");
  }
  const std::string_view combine = qualifiers.takeAny({"and", "or", "xor"});
  bool integral = false;
  const Rounding rounding = qualifiers.takeRounding(integral);
  const bool ftz = qualifiers.take("ftz");
  const bool sat = qualifiers.take("sat");
  const bool relu = qualifiers.take("relu");
  const bool nan = qualifiers.take("NaN");
  const bool approx = qualifiers.take("approx");
  std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  Type setResult = Type::kNone;
  if (base == "set") {
    if (types.size() != 2) return bindError(resolver, "set needs a result and a source type");
    setResult = types[0];
    types.erase(types.begin());
  }
  if (types.size() != 1) return unsupportedBinding(resolver, unsupported, "mixed half types");
  if (integral || (rounding != Rounding::kDefault && rounding != Rounding::kNearest)) {
    return unsupportedBinding(resolver, unsupported, "a rounding mode other than .rn on halves");
  }
  const Type type = types[0];
  const bool bf16 = type == Type::kBf16 || type == Type::kBf16x2;
  const bool packed = type == Type::kF16x2 || type == Type::kBf16x2;
  instruction.flags = static_cast<std::uint8_t>((ftz ? kHalfFtz : 0) | (sat ? kHalfSat : 0) |
                                                (relu ? kHalfRelu : 0) | (nan ? kHalfNan : 0));
  const std::vector<Operand>& operands = parsed.operands;
  auto bindAll = [&](std::size_t sources) {
    if (!expectOperands(parsed, sources + 1, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], type, resolver)) return false;
    for (std::size_t i = 1; i <= sources; ++i) {
      if (!bindSource(instruction, static_cast<int>(i), operands[i], type, resolver)) return false;
    }
    return true;
  };
  Handler handler = nullptr;
  if (base == "add" || base == "sub" || base == "mul") {
    if (!bindAll(2)) return false;
    if (base == "add") handler = halfFor<HAdd, 2>(bf16, packed);
    if (base == "sub") handler = halfFor<HSub, 2>(bf16, packed);
    if (base == "mul") handler = halfFor<HMul, 2>(bf16, packed);
  } else if (base == "fma") {
    if (!bindAll(3)) return false;
    handler = halfFor<HFma, 3>(bf16, packed);
  } else if (base == "min" || base == "max") {
    if (!bindAll(2)) return false;
    handler = base == "min" ? halfFor<HMin, 2>(bf16, packed) : halfFor<HMax, 2>(bf16, packed);
  } else if (base == "neg" || base == "abs") {
    if (!bindAll(1)) return false;
    const bool negate = base == "neg";
    if (packed) {
      handler = negate ? &halfSignHandler<true, true> : &halfSignHandler<true, false>;
    } else {
      handler = negate ? &halfSignHandler<false, true> : &halfSignHandler<false, false>;
    }
  } else if ((base == "ex2" || base == "tanh") && approx) {
    if (!bindAll(1)) return false;
    handler = base == "ex2" ? halfFor<HEx2, 1>(bf16, packed) : halfFor<HTanh, 1>(bf16, packed);
  } else if (base == "setp" || base == "set") {
    static constexpr std::string_view kComparisons[] = {
        "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};
    instruction.extra = static_cast<std::uint32_t>(
        std::find(std::begin(kComparisons), std::end(kComparisons), cmp) -
        std::begin(kComparisons));
    instruction.flags = 0;
    if (!bindCombine(parsed, combine, resolver, instruction, 3)) return false;
    if (ftz) instruction.flags |= 8;
    if (base == "set") {
      const bool integerResult = isInteger(setResult);
      if (!integerResult && setResult != Type::kF16 && setResult != Type::kF16x2 &&
          setResult != Type::kBf16 && setResult != Type::kBf16x2) {
        return unsupportedBinding(resolver, unsupported, "set with this result type");
      }
      if (integerResult) instruction.extra |= 0x100;
      if (integerResult && typeBytes(setResult) == 4) instruction.extra |= 0x200;
      if (!bindDestination(instruction, 0, operands[0], setResult, resolver) ||
          !bindSource(instruction, 1, operands[1], type, resolver) ||
          !bindSource(instruction, 2, operands[2], type, resolver)) {
        return false;
      }
      if (bf16) {
        instruction.handler = packed ? &halfSetHandler<true, true> : &halfSetHandler<true, false>;
      } else {
        instruction.handler = packed ? &halfSetHandler<false, true> : &halfSetHandler<false, false>;
      }
      return true;
    }
    if (!bindPredicate(instruction, 0, operands[0], resolver)) return false;
    if (operands[0].pairedPredicate) {
      Operand paired;
      paired.kind = Operand::Kind::kRegister;
      paired.name = *operands[0].pairedPredicate;
      if (!bindPredicate(instruction, 4, paired, resolver)) return false;
    }
    if (!bindSource(instruction, 1, operands[1], type, resolver) ||
        !bindSource(instruction, 2, operands[2], type, resolver)) {
      return false;
    }
    if (bf16) {
      handler = packed ? &halfCompareHandler<true, true> : &halfCompareHandler<true, false>;
    } else {
      handler = packed ? &halfCompareHandler<false, true> : &halfCompareHandler<false, false>;
    }
  } else {
    return unsupportedBinding(resolver, unsupported, "this half-precision instruction");
  }
  instruction.handler = handler;
  return true;
}

}  // namespace gpuproxy::server::ptx
