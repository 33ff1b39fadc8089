// f32 and f64 instructions. Compiled with -frounding-math: instructions with .rz/.rm/.rp run with
// the host's rounding mode set to match, and the compiler must not fold across that.
//
// What a GPU computes exactly (add, sub, mul, fma, div.rn, sqrt.rn, rcp.rn, conversions) is
// computed exactly here, with the same rounding, subnormal flushing (.ftz), saturation (.sat) and
// canonical NaN (0x7fffffff). The .approx functions (sin, cos, ex2, lg2, rsqrt, tanh, div.approx)
// are computed with the host's libm: within the error bounds the PTX ISA gives for them, but not
// bit for bit the GPU's values.

#include <cfenv>
#include <cmath>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

template <typename F>
struct FAdd {
  static F apply(F a, F b) { return a + b; }
};
template <typename F>
struct FSub {
  static F apply(F a, F b) { return a - b; }
};
template <typename F>
struct FMul {
  static F apply(F a, F b) { return a * b; }
};
template <typename F>
struct FDiv {
  static F apply(F a, F b) { return a / b; }
};
template <typename F>
struct FFma {
  static F apply(F a, F b, F c) { return std::fma(a, b, c); }
};
template <typename F>
struct FRcp {
  static F apply(F a) { return F(1) / a; }
};
template <typename F>
struct FSqrt {
  static F apply(F a) { return std::sqrt(a); }
};
template <typename F>
struct FRsqrt {
  static F apply(F a) { return F(1) / std::sqrt(a); }
};
template <typename F>
struct FSin {
  static F apply(F a) { return std::sin(a); }
};
template <typename F>
struct FCos {
  static F apply(F a) { return std::cos(a); }
};
template <typename F>
struct FLg2 {
  static F apply(F a) { return std::log2(a); }
};
template <typename F>
struct FEx2 {
  static F apply(F a) { return std::exp2(a); }
};
template <typename F>
struct FTanh {
  static F apply(F a) { return std::tanh(a); }
};
// min/max: a NaN operand is ignored (both NaN: NaN); -0.0 orders below +0.0. With .NaN, any NaN
// operand gives NaN.
template <typename F, bool PropagateNan>
struct FMin {
  static F apply(F a, F b) {
    if (std::isnan(a) || std::isnan(b)) {
      if (PropagateNan || (std::isnan(a) && std::isnan(b)))
        return std::numeric_limits<F>::quiet_NaN();
      return std::isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) return std::signbit(a) ? a : b;
    return a < b ? a : b;
  }
};
template <typename F, bool PropagateNan>
struct FMax {
  static F apply(F a, F b) {
    if (std::isnan(a) || std::isnan(b)) {
      if (PropagateNan || (std::isnan(a) && std::isnan(b)))
        return std::numeric_limits<F>::quiet_NaN();
      return std::isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) return std::signbit(a) ? b : a;
    return a > b ? a : b;
  }
};

// Arithmetic with .ftz (inputs and result flushed), .sat (result clamped to [0, 1]) and the
// canonical NaN.
template <typename F, bool Ftz, bool Sat>
F finish(F value) {
  if constexpr (Ftz) value = flushSubnormal(value);
  if constexpr (Sat) value = saturateUnit(value);
  return canonical(value);
}
template <typename F, bool Ftz>
F input(F value) {
  if constexpr (Ftz) return flushSubnormal(value);
  return value;
}

template <typename F, typename Op, bool Ftz, bool Sat>
bool floatUnary(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(finish<F, Ftz, Sat>(Op::apply(input<F, Ftz>(as<F>(a[lane])))));
  });
  return true;
}

template <typename F, typename Op, bool Ftz, bool Sat>
bool floatBinary(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(finish<F, Ftz, Sat>(
        Op::apply(input<F, Ftz>(as<F>(a[lane])), input<F, Ftz>(as<F>(b[lane])))));
  });
  return true;
}

template <typename F, typename Op, bool Ftz, bool Sat>
bool floatTernary(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(
        finish<F, Ftz, Sat>(Op::apply(input<F, Ftz>(as<F>(a[lane])), input<F, Ftz>(as<F>(b[lane])),
                                      input<F, Ftz>(as<F>(c[lane])))));
  });
  return true;
}

// The same handler with the host rounding mode set as the instruction asks.
template <Handler Inner, int Mode>
bool withRounding(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const int saved = std::fegetround();
  std::fesetround(Mode);
  const bool ok = Inner(context, instruction, mask);
  std::fesetround(saved);
  return ok;
}

template <Handler Inner>
Handler rounded(Rounding rounding) {
  switch (rounding) {
    case Rounding::kZero:
      return &withRounding<Inner, FE_TOWARDZERO>;
    case Rounding::kDown:
      return &withRounding<Inner, FE_DOWNWARD>;
    case Rounding::kUp:
      return &withRounding<Inner, FE_UPWARD>;
    default:
      return Inner;
  }
}

// abs and neg change only the sign bit (NaN payloads are kept).
template <typename F, bool Negate, bool Ftz>
bool signHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  forLanes(mask, [&](std::uint32_t lane) {
    const F value = input<F, Ftz>(as<F>(a[lane]));
    d[lane] = bitsOf(Negate ? -value : std::fabs(value));
  });
  return true;
}

template <typename F>
struct FCopysign {
  static F apply(F a, F b) { return std::copysign(b, a); }
};

template <typename F, int Kind>  // 0 finite 1 infinite 2 number 3 notanumber 4 normal 5 subnormal
bool testpHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* a = context.row(instruction.op[1]);
  std::uint32_t result = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const F value = as<F>(a[lane]);
    bool test = false;
    switch (Kind) {
      case 0:
        test = std::isfinite(value);
        break;
      case 1:
        test = std::isinf(value);
        break;
      case 2:
        test = !std::isnan(value);
        break;
      case 3:
        test = std::isnan(value);
        break;
      case 4:
        test = std::isnormal(value);
        break;
      default:
        test = std::fpclassify(value) == FP_SUBNORMAL;
        break;
    }
    result |= static_cast<std::uint32_t>(test) << lane;
  });
  std::uint32_t& p = context.preds[instruction.op[0]];
  p = (p & ~mask) | (result & mask);
  return true;
}

// Float comparisons: ordered ones are false when either operand is NaN, the "u" ones true.
#define GPUPROXY_FLOAT_COMPARE(Name, expression)             \
  template <typename F, bool Ftz>                            \
  struct Name {                                              \
    static bool apply(F a, F b) {                            \
      a = input<F, Ftz>(a);                                  \
      b = input<F, Ftz>(b);                                  \
      const bool unordered = std::isnan(a) || std::isnan(b); \
      (void)unordered;                                       \
      return expression;                                     \
    }                                                        \
  };
GPUPROXY_FLOAT_COMPARE(FEq, !unordered && a == b)
GPUPROXY_FLOAT_COMPARE(FNe, !unordered && a != b)
GPUPROXY_FLOAT_COMPARE(FLt, !unordered && a < b)
GPUPROXY_FLOAT_COMPARE(FLe, !unordered && a <= b)
GPUPROXY_FLOAT_COMPARE(FGt, !unordered && a > b)
GPUPROXY_FLOAT_COMPARE(FGe, !unordered && a >= b)
GPUPROXY_FLOAT_COMPARE(FEqu, unordered || a == b)
GPUPROXY_FLOAT_COMPARE(FNeu, unordered || a != b)
GPUPROXY_FLOAT_COMPARE(FLtu, unordered || a < b)
GPUPROXY_FLOAT_COMPARE(FLeu, unordered || a <= b)
GPUPROXY_FLOAT_COMPARE(FGtu, unordered || a > b)
GPUPROXY_FLOAT_COMPARE(FGeu, unordered || a >= b)
GPUPROXY_FLOAT_COMPARE(FNum, !unordered)
GPUPROXY_FLOAT_COMPARE(FNan, unordered)
#undef GPUPROXY_FLOAT_COMPARE

template <template <typename, bool> class Cmp, typename F>
Handler floatCompareFor(bool ftz, bool set, Type destination) {
  if (!set) return ftz ? &compareHandler<F, Cmp<F, true>> : &compareHandler<F, Cmp<F, false>>;
  if (destination == Type::kF32) {
    return ftz ? &setHandler<F, Cmp<F, true>, float> : &setHandler<F, Cmp<F, false>, float>;
  }
  if (destination == Type::kS32) {
    return ftz ? &setHandler<F, Cmp<F, true>, std::int32_t>
               : &setHandler<F, Cmp<F, false>, std::int32_t>;
  }
  return ftz ? &setHandler<F, Cmp<F, true>, std::uint32_t>
             : &setHandler<F, Cmp<F, false>, std::uint32_t>;
}

template <typename F>
Handler floatCompare(std::string_view cmp, bool ftz, bool set, Type destination) {
  if (cmp == "eq") return floatCompareFor<FEq, F>(ftz, set, destination);
  if (cmp == "ne") return floatCompareFor<FNe, F>(ftz, set, destination);
  if (cmp == "lt") return floatCompareFor<FLt, F>(ftz, set, destination);
  if (cmp == "le") return floatCompareFor<FLe, F>(ftz, set, destination);
  if (cmp == "gt") return floatCompareFor<FGt, F>(ftz, set, destination);
  if (cmp == "ge") return floatCompareFor<FGe, F>(ftz, set, destination);
  if (cmp == "equ") return floatCompareFor<FEqu, F>(ftz, set, destination);
  if (cmp == "neu") return floatCompareFor<FNeu, F>(ftz, set, destination);
  if (cmp == "ltu") return floatCompareFor<FLtu, F>(ftz, set, destination);
  if (cmp == "leu") return floatCompareFor<FLeu, F>(ftz, set, destination);
  if (cmp == "gtu") return floatCompareFor<FGtu, F>(ftz, set, destination);
  if (cmp == "geu") return floatCompareFor<FGeu, F>(ftz, set, destination);
  if (cmp == "num") return floatCompareFor<FNum, F>(ftz, set, destination);
  if (cmp == "nan") return floatCompareFor<FNan, F>(ftz, set, destination);
  return nullptr;
}

// Picks the handler for a float operation by type and qualifiers (nullptr for .ftz/.sat on f64).
#define GPUPROXY_FLOAT_PICK(Name, Shape)                                            \
  template <template <typename> class Op>                                           \
  Handler Name(Type type, bool ftz, bool sat, Rounding rounding) {                  \
    if (type == Type::kF64) {                                                       \
      if (ftz || sat) return nullptr;                                               \
      return rounded<&Shape<double, Op<double>, false, false>>(rounding);           \
    }                                                                               \
    if (ftz && sat) return rounded<&Shape<float, Op<float>, true, true>>(rounding); \
    if (ftz) return rounded<&Shape<float, Op<float>, true, false>>(rounding);       \
    if (sat) return rounded<&Shape<float, Op<float>, false, true>>(rounding);       \
    return rounded<&Shape<float, Op<float>, false, false>>(rounding);               \
  }
GPUPROXY_FLOAT_PICK(pickUnary, floatUnary)
GPUPROXY_FLOAT_PICK(pickBinary, floatBinary)
GPUPROXY_FLOAT_PICK(pickTernary, floatTernary)
#undef GPUPROXY_FLOAT_PICK

}  // namespace

bool bindFloat(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
               Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  const bool set = base == "set";
  std::string_view cmp;
  if (base == "setp" || set) {
    cmp = qualifiers.takeAny({"eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu",
                              "geu", "num", "nan"});
    if (cmp.empty()) return bindError(resolver, "missing comparison");
  }
  const std::string_view combine = qualifiers.takeAny({"and", "or", "xor"});
  bool integral = false;
  const Rounding rounding = qualifiers.takeRounding(integral);
  const bool ftz = qualifiers.take("ftz");
  const bool sat = qualifiers.take("sat");
  const bool approx = qualifiers.take("approx");
  const bool full = qualifiers.take("full");
  const bool nanPropagating = qualifiers.take("NaN");
  const std::string_view testKind = base == "testp"
                                        ? qualifiers.takeAny({"finite", "infinite", "number",
                                                              "notanumber", "normal", "subnormal"})
                                        : std::string_view{};
  std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (integral) return bindError(resolver, "integer rounding on a float operation");
  Type destination = Type::kNone;
  if (set) {
    if (types.size() != 2) return bindError(resolver, "set needs a result and a source type");
    destination = types[0];
    types.erase(types.begin());
  }
  if (types.size() != 1) return bindError(resolver, "expected one type");
  const Type type = types[0];
  if (type != Type::kF32 && type != Type::kF64) {
    return unsupportedBinding(resolver, unsupported, "this type");
  }
  const bool f64 = type == Type::kF64;
  if (f64 && (ftz || sat) && base != "rcp" && base != "rsqrt") {
    return bindError(resolver, ".ftz/.sat on f64");
  }
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
  if (base == "setp" || set) {
    if (!bindCombine(parsed, combine, resolver, instruction, 3)) return false;
    if (set) {
      if (!bindDestination(instruction, 0, operands[0], destination, resolver)) return false;
    } else {
      if (!bindPredicate(instruction, 0, operands[0], resolver)) return false;
      if (operands[0].pairedPredicate) {
        Operand paired;
        paired.kind = Operand::Kind::kRegister;
        paired.name = *operands[0].pairedPredicate;
        if (!bindPredicate(instruction, 4, paired, resolver)) return false;
      }
    }
    if (!bindSource(instruction, 1, operands[1], type, resolver) ||
        !bindSource(instruction, 2, operands[2], type, resolver)) {
      return false;
    }
    handler = f64 ? floatCompare<double>(cmp, ftz, set, destination)
                  : floatCompare<float>(cmp, ftz, set, destination);
  } else if (base == "add" || base == "sub" || base == "mul") {
    if (!bindAll(2)) return false;
    if (base == "add") handler = pickBinary<FAdd>(type, ftz, sat, rounding);
    if (base == "sub") handler = pickBinary<FSub>(type, ftz, sat, rounding);
    if (base == "mul") handler = pickBinary<FMul>(type, ftz, sat, rounding);
  } else if (base == "fma" || base == "mad") {
    if (!bindAll(3)) return false;
    handler = pickTernary<FFma>(type, ftz, sat, rounding);
  } else if (base == "div") {
    if (!bindAll(2)) return false;
    // div.approx and div.full: within 2 ulp on a GPU; the exact quotient here.
    if (!approx && !full && rounding == Rounding::kDefault) {
      return bindError(resolver, "div on floats needs .approx, .full or a rounding mode");
    }
    handler = pickBinary<FDiv>(type, ftz, sat, approx || full ? Rounding::kNearest : rounding);
  } else if (base == "rcp" || base == "sqrt") {
    if (!bindAll(1)) return false;
    const Rounding mode = approx ? Rounding::kNearest : rounding;
    if (base == "rcp") handler = pickUnary<FRcp>(type, ftz && !f64, sat, mode);
    if (base == "sqrt") handler = pickUnary<FSqrt>(type, ftz && !f64, sat, mode);
  } else if (base == "rsqrt" || base == "sin" || base == "cos" || base == "lg2" || base == "ex2" ||
             base == "tanh") {
    if (!approx) return bindError(resolver, "." + std::string(base) + " needs .approx");
    if (!bindAll(1)) return false;
    if (f64 && base != "rsqrt")
      return unsupportedBinding(resolver, unsupported, "f64 " + std::string(base));
    if (base == "rsqrt") handler = pickUnary<FRsqrt>(type, ftz && !f64, false, Rounding::kNearest);
    if (base == "sin") handler = pickUnary<FSin>(type, ftz, false, Rounding::kNearest);
    if (base == "cos") handler = pickUnary<FCos>(type, ftz, false, Rounding::kNearest);
    if (base == "lg2") handler = pickUnary<FLg2>(type, ftz, false, Rounding::kNearest);
    if (base == "ex2") handler = pickUnary<FEx2>(type, ftz, false, Rounding::kNearest);
    if (base == "tanh") handler = pickUnary<FTanh>(type, false, false, Rounding::kNearest);
  } else if (base == "abs" || base == "neg") {
    if (!bindAll(1)) return false;
    const bool negate = base == "neg";
    if (f64) {
      handler = negate ? &signHandler<double, true, false> : &signHandler<double, false, false>;
    } else if (ftz) {
      handler = negate ? &signHandler<float, true, true> : &signHandler<float, false, true>;
    } else {
      handler = negate ? &signHandler<float, true, false> : &signHandler<float, false, false>;
    }
  } else if (base == "min" || base == "max") {
    if (!bindAll(2)) return false;
    const bool isMin = base == "min";
    if (f64) {
      handler = isMin ? &floatBinary<double, FMin<double, false>, false, false>
                      : &floatBinary<double, FMax<double, false>, false, false>;
    } else if (nanPropagating) {
      handler = isMin ? (ftz ? &floatBinary<float, FMin<float, true>, true, false>
                             : &floatBinary<float, FMin<float, true>, false, false>)
                      : (ftz ? &floatBinary<float, FMax<float, true>, true, false>
                             : &floatBinary<float, FMax<float, true>, false, false>);
    } else {
      handler = isMin ? (ftz ? &floatBinary<float, FMin<float, false>, true, false>
                             : &floatBinary<float, FMin<float, false>, false, false>)
                      : (ftz ? &floatBinary<float, FMax<float, false>, true, false>
                             : &floatBinary<float, FMax<float, false>, false, false>);
    }
  } else if (base == "copysign") {
    if (!bindAll(2)) return false;
    handler = f64 ? &binaryHandler<double, double, FCopysign<double>>
                  : &binaryHandler<float, float, FCopysign<float>>;
  } else if (base == "testp") {
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (!bindPredicate(instruction, 0, operands[0], resolver) ||
        !bindSource(instruction, 1, operands[1], type, resolver)) {
      return false;
    }
    const int kind = testKind == "finite"       ? 0
                     : testKind == "infinite"   ? 1
                     : testKind == "number"     ? 2
                     : testKind == "notanumber" ? 3
                     : testKind == "normal"     ? 4
                                                : 5;
    if (testKind.empty()) return bindError(resolver, "testp needs a test");
    static constexpr Handler kFloatTests[] = {&testpHandler<float, 0>, &testpHandler<float, 1>,
                                              &testpHandler<float, 2>, &testpHandler<float, 3>,
                                              &testpHandler<float, 4>, &testpHandler<float, 5>};
    static constexpr Handler kDoubleTests[] = {&testpHandler<double, 0>, &testpHandler<double, 1>,
                                               &testpHandler<double, 2>, &testpHandler<double, 3>,
                                               &testpHandler<double, 4>, &testpHandler<double, 5>};
    handler = f64 ? kDoubleTests[kind] : kFloatTests[kind];
  } else {
    return unsupportedBinding(resolver, unsupported, "this float instruction");
  }
  if (handler == nullptr) return unsupportedBinding(resolver, unsupported, "these qualifiers");
  instruction.handler = handler;
  return true;
}

}  // namespace gpuproxy::server::ptx
