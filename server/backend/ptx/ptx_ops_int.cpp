// Integer, bit and predicate instructions.

#include <bit>
#include <climits>
#include <type_traits>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

template <typename T>
using Unsigned = std::make_unsigned_t<T>;

// Twice as wide, for mul.hi/mul.wide.
template <typename T>
struct Wider;
template <>
struct Wider<std::int16_t> {
  using type = std::int32_t;
};
template <>
struct Wider<std::uint16_t> {
  using type = std::uint32_t;
};
template <>
struct Wider<std::int32_t> {
  using type = std::int64_t;
};
template <>
struct Wider<std::uint32_t> {
  using type = std::uint64_t;
};
template <>
struct Wider<std::int64_t> {
  using type = __int128;
};
template <>
struct Wider<std::uint64_t> {
  using type = unsigned __int128;
};

template <typename T>
T wrap(std::uint64_t bits) {
  return static_cast<T>(static_cast<Unsigned<T>>(bits));
}

template <typename T>
struct Add {
  static T apply(T a, T b) { return wrap<T>(std::uint64_t(a) + std::uint64_t(b)); }
};
template <typename T>
struct Sub {
  static T apply(T a, T b) { return wrap<T>(std::uint64_t(a) - std::uint64_t(b)); }
};
template <typename T>
struct MulLo {
  static T apply(T a, T b) { return wrap<T>(std::uint64_t(a) * std::uint64_t(b)); }
};
template <typename T>
struct MulHi {
  static T apply(T a, T b) {
    using W = typename Wider<T>::type;
    return static_cast<T>((static_cast<W>(a) * static_cast<W>(b)) >> (8 * sizeof(T)));
  }
};
template <typename T>
struct MulWide {
  static typename Wider<T>::type apply(T a, T b) {
    using W = typename Wider<T>::type;
    return static_cast<W>(a) * static_cast<W>(b);
  }
};
template <typename T>
struct MadLo {
  static T apply(T a, T b, T c) {
    return wrap<T>(std::uint64_t(a) * std::uint64_t(b) + std::uint64_t(c));
  }
};
template <typename T>
struct MadHi {
  static T apply(T a, T b, T c) {
    return wrap<T>(std::uint64_t(MulHi<T>::apply(a, b)) + std::uint64_t(c));
  }
};
template <typename T>
struct MadWide {
  using W = typename Wider<T>::type;
  static W apply(T a, T b, W c) {
    using U = std::make_unsigned_t<W>;
    return static_cast<W>(static_cast<U>(static_cast<W>(a) * static_cast<W>(b)) +
                          static_cast<U>(c));
  }
};
// Division as a GPU does it, without the host's traps: x / 0 is all ones (unsigned) or -1 / 1 by
// the dividend's sign (signed); INT_MIN / -1 is INT_MIN.
template <typename T>
struct Div {
  static T apply(T a, T b) {
    if (b == 0) {
      if constexpr (std::is_signed_v<T>) return a >= 0 ? T(-1) : T(1);
      return static_cast<T>(~T(0));
    }
    if constexpr (std::is_signed_v<T>) {
      if (a == std::numeric_limits<T>::min() && b == -1) return a;
    }
    return static_cast<T>(a / b);
  }
};
template <typename T>
struct Rem {
  static T apply(T a, T b) {
    if (b == 0) return a;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return 0;
    }
    return static_cast<T>(a % b);
  }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return a < b ? a : b; }
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return a > b ? a : b; }
};
// min.relu/max.relu: the result clamped at zero from below.
template <typename T, typename Op>
struct Relu {
  static T apply(T a, T b) {
    const T result = Op::apply(a, b);
    return result < T{0} ? T{0} : result;
  }
};
// .s16x2/.u16x2 (sm_90): `Op` on each half-word of a 32-bit register on its own.
template <typename Half, typename Op>
struct PerHalf {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b) {
    std::uint32_t out = 0;
    for (unsigned i = 0; i < 2; ++i) {
      const Half x = static_cast<Half>(a >> (16 * i));
      const Half y = static_cast<Half>(b >> (16 * i));
      out |= std::uint32_t{static_cast<std::uint16_t>(Op::apply(x, y))} << (16 * i);
    }
    return out;
  }
};
template <typename T>
struct Abs {
  static T apply(T a) { return a < 0 ? wrap<T>(0 - std::uint64_t(a)) : a; }
};
template <typename T>
struct Neg {
  static T apply(T a) { return wrap<T>(0 - std::uint64_t(a)); }
};
template <typename T>
struct And {
  static T apply(T a, T b) { return a & b; }
};
template <typename T>
struct Or {
  static T apply(T a, T b) { return a | b; }
};
template <typename T>
struct Xor {
  static T apply(T a, T b) { return a ^ b; }
};
template <typename T>
struct Not {
  static T apply(T a) { return static_cast<T>(~a); }
};
template <typename T>
struct Cnot {
  static T apply(T a) { return a == 0 ? 1 : 0; }
};
template <typename T>
struct Popc {
  static std::uint32_t apply(T a) { return std::popcount(static_cast<Unsigned<T>>(a)); }
};
template <typename T>
struct Clz {
  static std::uint32_t apply(T a) { return std::countl_zero(static_cast<Unsigned<T>>(a)); }
};
template <typename T>
struct Brev {
  static T apply(T a) {
    auto value = static_cast<Unsigned<T>>(a);
    Unsigned<T> out = 0;
    for (unsigned i = 0; i < 8 * sizeof(T); ++i) {
      out = static_cast<Unsigned<T>>((out << 1) | (value & 1));
      value = static_cast<Unsigned<T>>(value >> 1);
    }
    return static_cast<T>(out);
  }
};
// bfind: the position of the most significant bit that differs from the sign (signed) or is set
// (unsigned); 0xffffffff when there is none. ShiftAmount: counted from the top instead.
template <typename T, bool ShiftAmount>
struct Bfind {
  static std::uint32_t apply(T a) {
    auto value = static_cast<Unsigned<T>>(a);
    if constexpr (std::is_signed_v<T>) {
      if (a < 0) value = static_cast<Unsigned<T>>(~value);
    }
    if (value == 0) return 0xffffffffu;
    const std::uint32_t position = 8 * sizeof(T) - 1 - std::countl_zero(value);
    return ShiftAmount ? 8 * sizeof(T) - 1 - position : position;
  }
};
template <typename T>
struct Shl {
  static T apply(T a, std::uint32_t b) {
    if (b >= 8 * sizeof(T)) return 0;
    return static_cast<T>(static_cast<Unsigned<T>>(a) << b);
  }
};
template <typename T>
struct Shr {
  static T apply(T a, std::uint32_t b) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>(a >> std::min<std::uint32_t>(b, 8 * sizeof(T) - 1));
    } else {
      return b >= 8 * sizeof(T) ? T(0) : static_cast<T>(a >> b);
    }
  }
};
// bfe: `len` bits from `pos` (each the low 8 bits), sign-extended for signed types.
template <typename T>
struct Bfe {
  static T apply(T a, std::uint32_t pos32, std::uint32_t len32) {
    constexpr unsigned kMsb = 8 * sizeof(T) - 1;
    const unsigned pos = pos32 & 0xff;
    const unsigned len = len32 & 0xff;
    const auto value = static_cast<Unsigned<T>>(a);
    bool sign = false;
    if (std::is_signed_v<T> && len != 0) sign = ((value >> std::min(pos + len - 1, kMsb)) & 1) != 0;
    Unsigned<T> out = 0;
    for (unsigned i = 0; i <= kMsb; ++i) {
      const bool bit = (i < len && pos + i <= kMsb) ? ((value >> (pos + i)) & 1) != 0 : sign;
      out = static_cast<Unsigned<T>>(out | (static_cast<Unsigned<T>>(bit) << i));
    }
    return static_cast<T>(out);
  }
};
// bfi: `len` bits of `a` into `b` at `pos`.
template <typename T>
struct Bfi {
  static T apply(T a, T b, std::uint32_t pos32, std::uint32_t len32) {
    constexpr unsigned kBits = 8 * sizeof(T);
    const unsigned pos = pos32 & 0xff;
    const unsigned len = len32 & 0xff;
    auto out = static_cast<Unsigned<T>>(b);
    const auto insert = static_cast<Unsigned<T>>(a);
    for (unsigned i = 0; i < len && pos + i < kBits; ++i) {
      const Unsigned<T> bit = static_cast<Unsigned<T>>(Unsigned<T>(1) << (pos + i));
      out = static_cast<Unsigned<T>>(((insert >> i) & 1) != 0 ? (out | bit) : (out & ~bit));
    }
    return static_cast<T>(out);
  }
};
template <typename T>
struct Sad {
  static T apply(T a, T b, T c) {
    const T difference = a > b ? wrap<T>(std::uint64_t(a) - std::uint64_t(b))
                               : wrap<T>(std::uint64_t(b) - std::uint64_t(a));
    return wrap<T>(std::uint64_t(difference) + std::uint64_t(c));
  }
};
template <typename T>
struct Mul24Lo {
  static T apply(T a, T b) {
    const std::int64_t x = std::is_signed_v<T> ? (static_cast<std::int64_t>(a) << 40) >> 40
                                               : static_cast<std::int64_t>(a & 0xffffff);
    const std::int64_t y = std::is_signed_v<T> ? (static_cast<std::int64_t>(b) << 40) >> 40
                                               : static_cast<std::int64_t>(b & 0xffffff);
    return wrap<T>(static_cast<std::uint64_t>(x * y));
  }
};
template <typename T>
struct Mul24Hi {
  static T apply(T a, T b) {
    const std::int64_t x = std::is_signed_v<T> ? (static_cast<std::int64_t>(a) << 40) >> 40
                                               : static_cast<std::int64_t>(a & 0xffffff);
    const std::int64_t y = std::is_signed_v<T> ? (static_cast<std::int64_t>(b) << 40) >> 40
                                               : static_cast<std::int64_t>(b & 0xffffff);
    return wrap<T>(static_cast<std::uint64_t>(x * y) >> 16);
  }
};
template <typename T>
struct Mad24Lo {
  static T apply(T a, T b, T c) {
    return wrap<T>(std::uint64_t(Mul24Lo<T>::apply(a, b)) + std::uint64_t(c));
  }
};
struct AddSat {
  static std::int32_t apply(std::int32_t a, std::int32_t b) {
    const std::int64_t sum = std::int64_t{a} + b;
    return static_cast<std::int32_t>(std::clamp<std::int64_t>(sum, INT32_MIN, INT32_MAX));
  }
};
struct SubSat {
  static std::int32_t apply(std::int32_t a, std::int32_t b) {
    const std::int64_t difference = std::int64_t{a} - b;
    return static_cast<std::int32_t>(std::clamp<std::int64_t>(difference, INT32_MIN, INT32_MAX));
  }
};
// fns: the position of the offset-th set bit of mask counting from bit base, upward for a positive
// offset and downward for a negative one (0: base itself, if set); 0xffffffff when there is none.
struct Fns {
  static std::uint32_t apply(std::uint32_t mask, std::uint32_t base, std::int32_t offset) {
    constexpr std::uint32_t kNone = 0xffffffffu;
    if (base > 31) return kNone;  // undefined in PTX
    if (offset == 0) return ((mask >> base) & 1) != 0 ? base : kNone;
    const int step = offset > 0 ? 1 : -1;
    std::int64_t count = offset > 0 ? std::int64_t{offset} : -std::int64_t{offset};
    for (int position = static_cast<int>(base); position >= 0 && position < 32; position += step) {
      if (((mask >> position) & 1) != 0 && --count == 0)
        return static_cast<std::uint32_t>(position);
    }
    return kNone;
  }
};

struct Lop3 {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t lut) {
    std::uint32_t out = 0;
    for (unsigned i = 0; i < 32; ++i) {
      const unsigned index = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1);
      out |= ((lut >> index) & 1) << i;
    }
    return out;
  }
};
// prmt: bytes of {b, a} picked by the selector's nibbles (default mode), with sign replication.
struct Prmt {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    const std::uint64_t bytes = (std::uint64_t{b} << 32) | a;
    std::uint32_t out = 0;
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned selector = (c >> (4 * i)) & 0xf;
      std::uint32_t byte = (bytes >> (8 * (selector & 7))) & 0xff;
      if ((selector & 8) != 0) byte = (byte & 0x80) != 0 ? 0xff : 0;
      out |= byte << (8 * i);
    }
    return out;
  }
};
template <unsigned Mode>  // 1 f4e, 2 b4e, 3 rc8, 4 ecl, 5 ecr, 6 rc16
struct PrmtMode {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    const std::uint64_t bytes = (std::uint64_t{b} << 32) | a;
    const unsigned s = c & 3;
    unsigned pick[4] = {0, 0, 0, 0};
    for (unsigned i = 0; i < 4; ++i) {
      switch (Mode) {
        case 1:
          pick[i] = (s + i) & 7;
          break;
        case 2:
          pick[i] = (s + 8 - i) & 7;
          break;
        case 3:
          pick[i] = s;
          break;
        case 4:
          pick[i] = i >= s ? i : s;
          break;
        case 5:
          pick[i] = i <= s ? i : s;
          break;
        default:
          pick[i] = (s & 1) * 2 + (i & 1);
          break;
      }
    }
    std::uint32_t out = 0;
    for (unsigned i = 0; i < 4; ++i) out |= ((bytes >> (8 * pick[i])) & 0xff) << (8 * i);
    return out;
  }
};
// shf: funnel shift of the 64-bit {b:a}; .clamp limits the amount to 32, .wrap takes it mod 32.
template <bool Left, bool Clamp>
struct Shf {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    const std::uint32_t n = Clamp ? std::min<std::uint32_t>(c, 32) : (c & 31);
    const std::uint64_t both = (std::uint64_t{b} << 32) | a;
    if (Left) return static_cast<std::uint32_t>((both << n) >> 32);
    return static_cast<std::uint32_t>(both >> n);
  }
};
template <bool SignedA, bool SignedB>
struct Dp4a {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    std::int64_t sum = static_cast<std::int32_t>(c);
    if (!SignedA && !SignedB) sum = c;
    for (unsigned i = 0; i < 4; ++i) {
      const std::uint32_t x = (a >> (8 * i)) & 0xff;
      const std::uint32_t y = (b >> (8 * i)) & 0xff;
      const std::int64_t sx = SignedA ? static_cast<std::int8_t>(x) : static_cast<std::int64_t>(x);
      const std::int64_t sy = SignedB ? static_cast<std::int8_t>(y) : static_cast<std::int64_t>(y);
      sum += sx * sy;
    }
    return static_cast<std::uint32_t>(sum);
  }
};
template <bool SignedA, bool SignedB, bool High>
struct Dp2a {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    std::int64_t sum =
        (SignedA || SignedB) ? std::int64_t{static_cast<std::int32_t>(c)} : std::int64_t{c};
    for (unsigned i = 0; i < 2; ++i) {
      const std::uint32_t x = (a >> (16 * i)) & 0xffff;
      const std::uint32_t y = (b >> (8 * (i + (High ? 2 : 0)))) & 0xff;
      const std::int64_t sx = SignedA ? static_cast<std::int16_t>(x) : static_cast<std::int64_t>(x);
      const std::int64_t sy = SignedB ? static_cast<std::int8_t>(y) : static_cast<std::int64_t>(y);
      sum += sx * sy;
    }
    return static_cast<std::uint32_t>(sum);
  }
};
// szext: sign- or zero-extends the low `b` bits (clamped to 32 or taken mod 32).
template <bool Signed, bool Clamp>
struct Szext {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b) {
    const std::uint32_t n = Clamp ? std::min<std::uint32_t>(b, 32) : (b & 31);
    if (n == 0) return 0;
    if (n >= 32) return a;
    const std::uint32_t low = a & ((1u << n) - 1);
    if (Signed && ((low >> (n - 1)) & 1) != 0) return low | ~((1u << n) - 1);
    return low;
  }
};
// bmsk: a mask of `b` ones from bit `a`.
template <bool Clamp>
struct Bmsk {
  static std::uint32_t apply(std::uint32_t a, std::uint32_t b) {
    const std::uint32_t position = Clamp ? std::min<std::uint32_t>(a, 32) : (a & 31);
    const std::uint32_t width = Clamp ? std::min<std::uint32_t>(b, 32) : (b & 31);
    const std::uint64_t ones = (std::uint64_t{1} << std::min<std::uint32_t>(width, 32)) - 1;
    return static_cast<std::uint32_t>((ones << position) & 0xffffffffu);
  }
};

// Comparisons.
template <typename T>
struct Eq {
  static bool apply(T a, T b) { return a == b; }
};
template <typename T>
struct Ne {
  static bool apply(T a, T b) { return a != b; }
};
template <typename T>
struct Lt {
  static bool apply(T a, T b) { return a < b; }
};
template <typename T>
struct Le {
  static bool apply(T a, T b) { return a <= b; }
};
template <typename T>
struct Gt {
  static bool apply(T a, T b) { return a > b; }
};
template <typename T>
struct Ge {
  static bool apply(T a, T b) { return a >= b; }
};

// selp: d = c ? a : b.
template <typename T>
bool selectHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint32_t c = context.preds[instruction.op[3]];
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = ((c >> lane) & 1) != 0 ? a[lane] : b[lane]; });
  return true;
}

// slct: d = (c >= 0) ? a : b, c an s32 or an f32 (-0.0 counts as >= 0).
template <typename C>
bool slctHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  forLanes(mask, [&](std::uint32_t lane) {
    const C value = as<C>(c[lane]);
    bool positive = value >= 0;
    if constexpr (std::is_same_v<C, float>) {
      if ((instruction.flags & 1) != 0)
        positive = positive || std::fpclassify(value) == FP_SUBNORMAL;
    }
    d[lane] = positive ? a[lane] : b[lane];
  });
  return true;
}

// Predicate logic: op[0] = op[1] OP op[2] on lane masks.
template <int Operation>  // 0 and, 1 or, 2 xor, 3 not, 4 mov
bool predicateLogic(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint32_t a = context.preds[instruction.op[1]];
  std::uint32_t value = 0;
  switch (Operation) {
    case 0:
      value = a & context.preds[instruction.op[2]];
      break;
    case 1:
      value = a | context.preds[instruction.op[2]];
      break;
    case 2:
      value = a ^ context.preds[instruction.op[2]];
      break;
    case 3:
      value = ~a;
      break;
    default:
      value = a;
      break;
  }
  std::uint32_t& d = context.preds[instruction.op[0]];
  d = (d & ~mask) | (value & mask);
  return true;
}

// Extended-precision arithmetic through a per-lane carry row: flags bit 0: reads the carry in,
// bit 1: writes the carry out, bit 2: subtract.
template <typename T>
bool carryAddHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  using U = Unsigned<T>;
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  std::uint64_t* carry = context.row(instruction.op[3]);
  const bool carryIn = (instruction.flags & 1) != 0;
  const bool carryOut = (instruction.flags & 2) != 0;
  const bool subtract = (instruction.flags & 4) != 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const U x = static_cast<U>(a[lane]);
    const U y = static_cast<U>(b[lane]);
    const U in = carryIn ? static_cast<U>(carry[lane] & 1) : 0;
    U result = 0;
    bool out = false;
    if (subtract) {
      // x - y - borrow; the carry flag holds the borrow.
      result = static_cast<U>(x - y - in);
      out = (static_cast<unsigned __int128>(y) + in) > x;
    } else {
      result = static_cast<U>(x + y + in);
      out = (static_cast<unsigned __int128>(x) + y + in) >> (8 * sizeof(U)) != 0;
    }
    d[lane] = bitsOf(static_cast<T>(result));
    if (carryOut) carry[lane] = out ? 1 : 0;
  });
  return true;
}

// mad.lo/hi with carry: d = lo/hi(a * b) + c (+ carry in), carry out.
template <typename T, bool High>
bool carryMadHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  using U = Unsigned<T>;
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  std::uint64_t* carry = context.row(instruction.op[4]);
  const bool carryIn = (instruction.flags & 1) != 0;
  const bool carryOut = (instruction.flags & 2) != 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const T x = as<T>(a[lane]);
    const T y = as<T>(b[lane]);
    const U product = static_cast<U>(High ? MulHi<T>::apply(x, y) : MulLo<T>::apply(x, y));
    const U z = static_cast<U>(c[lane]);
    const U in = carryIn ? static_cast<U>(carry[lane] & 1) : 0;
    const U result = static_cast<U>(product + z + in);
    d[lane] = bitsOf(static_cast<T>(result));
    if (carryOut) {
      carry[lane] =
          (static_cast<unsigned __int128>(product) + z + in) >> (8 * sizeof(U)) != 0 ? 1 : 0;
    }
  });
  return true;
}

// ---- Binding ----------------------------------------------------------------------------------

// Calls `make.template operator()<T>()` with the C++ type of an integer PTX type.
template <typename Make>
Handler byIntegerType(Type type, Make&& make) {
  switch (type) {
    case Type::kB16:
    case Type::kU16:
      return make.template operator()<std::uint16_t>();
    case Type::kS16:
      return make.template operator()<std::int16_t>();
    case Type::kB32:
    case Type::kU32:
      return make.template operator()<std::uint32_t>();
    case Type::kS32:
      return make.template operator()<std::int32_t>();
    case Type::kB64:
    case Type::kU64:
      return make.template operator()<std::uint64_t>();
    case Type::kS64:
      return make.template operator()<std::int64_t>();
    default:
      return nullptr;
  }
}

template <template <typename> class Cmp>
Handler integerCompare(Type type, bool set, Type destination) {
  return byIntegerType(type, [&]<typename T>() -> Handler {
    if (!set) return &compareHandler<T, Cmp<T>>;
    if (destination == Type::kF32) return &setHandler<T, Cmp<T>, float>;
    if (destination == Type::kS32) return &setHandler<T, Cmp<T>, std::int32_t>;
    return &setHandler<T, Cmp<T>, std::uint32_t>;
  });
}

template <typename T>
using Unsigned64 = std::conditional_t<std::is_signed_v<T>, std::make_unsigned_t<T>, T>;

// add, sub, min and max on .s16x2/.u16x2: two half-words per 32-bit register.
template <typename Half>
Handler packedHalvesHandler(std::string_view base, bool relu) {
  using Word = std::uint32_t;
  if (relu) {
    return base == "min" ? &binaryHandler<Word, Word, PerHalf<Half, Relu<Half, Min<Half>>>>
                         : &binaryHandler<Word, Word, PerHalf<Half, Relu<Half, Max<Half>>>>;
  }
  if (base == "add") return &binaryHandler<Word, Word, PerHalf<Half, Add<Half>>>;
  if (base == "sub") return &binaryHandler<Word, Word, PerHalf<Half, Sub<Half>>>;
  if (base == "min") return &binaryHandler<Word, Word, PerHalf<Half, Min<Half>>>;
  if (base == "max") return &binaryHandler<Word, Word, PerHalf<Half, Max<Half>>>;
  return nullptr;
}

bool bindPackedHalves(const ParsedInstruction& parsed, std::string_view base, bool isSigned,
                      bool relu, OperandResolver& resolver, Instruction& instruction,
                      bool& unsupported) {
  if (relu && !isSigned) return bindError(resolver, ".relu needs .s32 or .s16x2");
  const Handler handler = isSigned ? packedHalvesHandler<std::int16_t>(base, relu)
                                   : packedHalvesHandler<std::uint16_t>(base, relu);
  if (handler == nullptr) {
    return unsupportedBinding(resolver, unsupported, std::string(base) + " on .s16x2/.u16x2");
  }
  if (!expectOperands(parsed, 3, resolver)) return false;
  if (!bindDestination(instruction, 0, parsed.operands[0], Type::kB32, resolver) ||
      !bindSource(instruction, 1, parsed.operands[1], Type::kB32, resolver) ||
      !bindSource(instruction, 2, parsed.operands[2], Type::kB32, resolver)) {
    return false;
  }
  instruction.handler = handler;
  return true;
}

}  // namespace

bool isIntegerOpcode(std::string_view base) {
  static constexpr std::string_view kOpcodes[] = {
      "add",  "sub", "mul",  "mad",  "mul24", "mad24", "sad",  "div", "rem",   "abs",  "neg",
      "min",  "max", "popc", "clz",  "bfind", "brev",  "bfe",  "bfi", "szext", "bmsk", "dp4a",
      "dp2a", "and", "or",   "xor",  "not",   "cnot",  "lop3", "shf", "shl",   "shr",  "prmt",
      "setp", "set", "selp", "slct", "addc",  "subc",  "madc", "fns"};
  return std::find(std::begin(kOpcodes), std::end(kOpcodes), base) != std::end(kOpcodes);
}

// Binds the comparison part of setp/set: the comparison name and the optional .and/.or/.xor with
// its predicate operand at `combineIndex` of the parsed operands.
bool bindCombine(const ParsedInstruction& parsed, std::string_view combine,
                 OperandResolver& resolver, Instruction& instruction, std::size_t combineIndex) {
  if (combine.empty()) {
    if (parsed.operands.size() != combineIndex) {
      return bindError(resolver, "expected " + std::to_string(combineIndex) + " operands");
    }
    return true;
  }
  if (parsed.operands.size() != combineIndex + 1) {
    return bindError(resolver, "expected " + std::to_string(combineIndex + 1) + " operands");
  }
  instruction.flags = combine == "and" ? 1 : combine == "or" ? 2 : 3;
  const Operand& predicate = parsed.operands[combineIndex];
  if (predicate.negated) instruction.flags |= 4;
  return bindPredicate(instruction, 3, predicate, resolver);
}

// setp and set with an integer comparison (the float ones are in ptx_ops_float.cpp).
bool bindIntegerCompare(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                        OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const bool set = qualifiers.base() == "set";
  const std::string_view cmp =
      qualifiers.takeAny({"eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs"});
  if (cmp.empty()) return bindError(resolver, "missing comparison");
  const std::string_view combine = qualifiers.takeAny({"and", "or", "xor"});
  std::vector<Type> types = qualifiers.takeTypes();
  Type destination = Type::kPred;
  if (set) {
    if (types.size() != 2) return bindError(resolver, "set needs a result and a source type");
    destination = types[0];
    types.erase(types.begin());
  }
  if (types.size() != 1) return bindError(resolver, "expected one type");
  Type type = types[0];
  // lo/ls/hi/hs compare as unsigned.
  const bool unsignedCompare = cmp == "lo" || cmp == "ls" || cmp == "hi" || cmp == "hs";
  if (unsignedCompare) {
    if (type == Type::kS16) type = Type::kU16;
    if (type == Type::kS32) type = Type::kU32;
    if (type == Type::kS64) type = Type::kU64;
  }
  if (!bindCombine(parsed, combine, resolver, instruction, 3)) return false;
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (set) {
    if (!bindDestination(instruction, 0, parsed.operands[0], destination, resolver)) return false;
  } else {
    if (!bindPredicate(instruction, 0, parsed.operands[0], resolver)) return false;
    if (parsed.operands[0].pairedPredicate) {
      Operand paired;
      paired.kind = Operand::Kind::kRegister;
      paired.name = *parsed.operands[0].pairedPredicate;
      if (!bindPredicate(instruction, 4, paired, resolver)) return false;
    }
  }
  if (!bindSource(instruction, 1, parsed.operands[1], type, resolver) ||
      !bindSource(instruction, 2, parsed.operands[2], type, resolver)) {
    return false;
  }
  Handler handler = nullptr;
  if (cmp == "eq") handler = integerCompare<Eq>(type, set, destination);
  if (cmp == "ne") handler = integerCompare<Ne>(type, set, destination);
  if (cmp == "lt" || cmp == "lo") handler = integerCompare<Lt>(type, set, destination);
  if (cmp == "le" || cmp == "ls") handler = integerCompare<Le>(type, set, destination);
  if (cmp == "gt" || cmp == "hi") handler = integerCompare<Gt>(type, set, destination);
  if (cmp == "ge" || cmp == "hs") handler = integerCompare<Ge>(type, set, destination);
  if (handler == nullptr) return unsupportedBinding(resolver, unsupported, "comparison type");
  instruction.handler = handler;
  return true;
}

bool bindInteger(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  if (base == "setp" || base == "set") {
    return bindIntegerCompare(parsed, qualifiers, resolver, instruction, unsupported);
  }
  const std::vector<Type> types = qualifiers.takeTypes();
  const std::string_view part = qualifiers.takeAny({"lo", "hi", "wide"});
  const bool cc = qualifiers.take("cc");
  const bool sat = qualifiers.take("sat");
  const std::string_view clampMode = qualifiers.takeAny({"clamp", "wrap"});
  const std::string_view direction = qualifiers.takeAny({"l", "r"});
  const bool shiftAmount = qualifiers.take("shiftamt");
  const std::string_view prmtMode = qualifiers.takeAny({"f4e", "b4e", "rc8", "ecl", "ecr", "rc16"});
  const bool ftz = base == "slct" && qualifiers.take("ftz");
  const bool relu = (base == "min" || base == "max") && qualifiers.take("relu");
  const std::string_view halves = qualifiers.takeAny({"s16x2", "u16x2"});
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (!halves.empty()) {
    return bindPackedHalves(parsed, base, halves == "s16x2", relu, resolver, instruction,
                            unsupported);
  }
  if (types.empty()) return bindError(resolver, "missing type");
  const Type type = types.back();
  const std::vector<Operand>& operands = parsed.operands;
  auto sources = [&](std::size_t count, std::initializer_list<Type> sourceTypes) {
    if (!expectOperands(parsed, count + 1, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], type, resolver)) return false;
    auto sourceType = sourceTypes.begin();
    for (std::size_t i = 0; i < count; ++i) {
      const Type t = sourceType != sourceTypes.end() ? *sourceType++ : type;
      if (!bindSource(instruction, static_cast<int>(i + 1), operands[i + 1], t, resolver)) {
        return false;
      }
    }
    return true;
  };
  // Predicate logic.
  if (type == Type::kPred) {
    if (base != "and" && base != "or" && base != "xor" && base != "not") {
      return bindError(resolver, "a predicate type on an arithmetic instruction");
    }
    const std::size_t count = base == "not" ? 2 : 3;
    if (!expectOperands(parsed, count, resolver)) return false;
    for (std::size_t i = 0; i < count; ++i) {
      if (operands[i].negated) return bindError(resolver, "negated predicate operand");
      if (!bindPredicate(instruction, static_cast<int>(i), operands[i], resolver)) return false;
    }
    if (base == "and") instruction.handler = &predicateLogic<0>;
    if (base == "or") instruction.handler = &predicateLogic<1>;
    if (base == "xor") instruction.handler = &predicateLogic<2>;
    if (base == "not") instruction.handler = &predicateLogic<3>;
    return true;
  }
  Handler handler = nullptr;
  if (base == "selp") {
    if (!expectOperands(parsed, 4, resolver)) return false;
    if (typeBytes(type) > 8) return bindError(resolver, "selp type");
    if (!bindDestination(instruction, 0, operands[0], type, resolver) ||
        !bindSource(instruction, 1, operands[1], type, resolver) ||
        !bindSource(instruction, 2, operands[2], type, resolver) ||
        !bindPredicate(instruction, 3, operands[3], resolver)) {
      return false;
    }
    if (operands[3].negated) return bindError(resolver, "negated selp predicate");
    instruction.handler = &selectHandler<std::uint64_t>;
    return true;
  }
  if (base == "slct") {
    if (types.size() != 2 || (types[1] != Type::kS32 && types[1] != Type::kF32)) {
      return bindError(resolver, "slct needs a value type and .s32/.f32");
    }
    if (!sources(3, {types[0], types[0], types[1]})) return false;
    instruction.flags = ftz ? 1 : 0;
    instruction.handler = types[1] == Type::kS32 ? &slctHandler<std::int32_t> : &slctHandler<float>;
    return true;
  }
  if (!isInteger(type)) return unsupportedBinding(resolver, unsupported, "type of an integer op");
  const bool isSigned = ptx::isSigned(type);
  // Carry arithmetic.
  if (base == "addc" || base == "subc" || ((base == "add" || base == "sub") && cc)) {
    if (typeBytes(type) < 4) return bindError(resolver, "carry arithmetic needs 32 or 64 bits");
    if (!sources(2, {})) return false;
    instruction.op[3] = resolver.carry();
    instruction.flags =
        static_cast<std::uint8_t>((base == "addc" || base == "subc" ? 1 : 0) | (cc ? 2 : 0) |
                                  (base == "sub" || base == "subc" ? 4 : 0));
    handler = byIntegerType(type, []<typename T>() -> Handler { return &carryAddHandler<T>; });
  } else if (base == "madc" || (base == "mad" && cc)) {
    if (typeBytes(type) < 4 || part == "wide") {
      return bindError(resolver, "mad with carry needs .lo/.hi on 32 or 64 bits");
    }
    if (!sources(3, {})) return false;
    instruction.op[4] = resolver.carry();
    instruction.flags = static_cast<std::uint8_t>((base == "madc" ? 1 : 0) | (cc ? 2 : 0));
    handler =
        part == "hi"
            ? byIntegerType(type, []<typename T>() -> Handler { return &carryMadHandler<T, true>; })
            : byIntegerType(type,
                            []<typename T>() -> Handler { return &carryMadHandler<T, false>; });
  } else if (base == "add" || base == "sub") {
    if (!sources(2, {})) return false;
    if (sat) {
      if (type != Type::kS32) return bindError(resolver, ".sat needs .s32");
      handler = base == "add" ? &binaryHandler<std::int32_t, std::int32_t, AddSat>
                              : &binaryHandler<std::int32_t, std::int32_t, SubSat>;
    } else if (base == "add") {
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Add<T>>; });
    } else {
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Sub<T>>; });
    }
  } else if (base == "mul") {
    if (!sources(2, {})) return false;
    if (part == "hi") {
      handler = byIntegerType(
          type, []<typename T>() -> Handler { return &binaryHandler<T, T, MulHi<T>>; });
    } else if (part == "wide") {
      if (typeBytes(type) == 8) return bindError(resolver, "mul.wide on 64 bits");
      handler = byIntegerType(type, []<typename T>() -> Handler {
        if constexpr (sizeof(T) < 8) return &binaryHandler<T, T, MulWide<T>>;
        return nullptr;
      });
    } else {
      handler = byIntegerType(
          type, []<typename T>() -> Handler { return &binaryHandler<T, T, MulLo<T>>; });
    }
  } else if (base == "mad") {
    if (part == "wide") {
      if (typeBytes(type) == 8) return bindError(resolver, "mad.wide on 64 bits");
      const Type wide = typeBytes(type) == 2 ? (isSigned ? Type::kS32 : Type::kU32)
                                             : (isSigned ? Type::kS64 : Type::kU64);
      if (!sources(3, {type, type, wide})) return false;
      handler = byIntegerType(type, []<typename T>() -> Handler {
        if constexpr (sizeof(T) < 8) {
          using W = typename Wider<T>::type;
          return &ternaryHandler<T, T, W, MadWide<T>>;
        }
        return nullptr;
      });
    } else {
      if (!sources(3, {})) return false;
      if (sat) return unsupportedBinding(resolver, unsupported, "mad.hi.sat");
      handler = part == "hi" ? byIntegerType(type,
                                             []<typename T>() -> Handler {
                                               return &ternaryHandler<T, T, T, MadHi<T>>;
                                             })
                             : byIntegerType(type, []<typename T>() -> Handler {
                                 return &ternaryHandler<T, T, T, MadLo<T>>;
                               });
    }
  } else if (base == "mul24" || base == "mad24") {
    if (typeBytes(type) != 4) return bindError(resolver, "24-bit multiply needs 32 bits");
    if (base == "mul24") {
      if (!sources(2, {})) return false;
      handler =
          part == "hi"
              ? byIntegerType(
                    type, []<typename T>() -> Handler { return &binaryHandler<T, T, Mul24Hi<T>>; })
              : byIntegerType(
                    type, []<typename T>() -> Handler { return &binaryHandler<T, T, Mul24Lo<T>>; });
    } else {
      if (!sources(3, {})) return false;
      if (part == "hi") return unsupportedBinding(resolver, unsupported, "mad24.hi");
      handler = byIntegerType(
          type, []<typename T>() -> Handler { return &ternaryHandler<T, T, T, Mad24Lo<T>>; });
    }
  } else if (base == "sad") {
    if (!sources(3, {})) return false;
    handler = byIntegerType(
        type, []<typename T>() -> Handler { return &ternaryHandler<T, T, T, Sad<T>>; });
  } else if (base == "div" || base == "rem" || base == "min" || base == "max") {
    if (!sources(2, {})) return false;
    if (base == "div")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Div<T>>; });
    if (base == "rem")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Rem<T>>; });
    if (base == "min")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Min<T>>; });
    if (base == "max")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Max<T>>; });
    if (relu) {
      if (type != Type::kS32) return bindError(resolver, ".relu needs .s32 or .s16x2");
      handler =
          base == "min"
              ? &binaryHandler<std::int32_t, std::int32_t, Relu<std::int32_t, Min<std::int32_t>>>
              : &binaryHandler<std::int32_t, std::int32_t, Relu<std::int32_t, Max<std::int32_t>>>;
    }
  } else if (base == "abs" || base == "neg" || base == "not" || base == "cnot" || base == "brev") {
    if (!sources(1, {})) return false;
    if (base == "abs")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Abs<T>>; });
    if (base == "neg")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Neg<T>>; });
    if (base == "not")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Not<T>>; });
    if (base == "cnot")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Cnot<T>>; });
    if (base == "brev")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Brev<T>>; });
  } else if (base == "popc" || base == "clz" || base == "bfind") {
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], Type::kU32, resolver) ||
        !bindSource(instruction, 1, operands[1], type, resolver)) {
      return false;
    }
    if (base == "popc")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Popc<T>>; });
    if (base == "clz")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &unaryHandler<T, Clz<T>>; });
    if (base == "bfind") {
      handler =
          shiftAmount
              ? byIntegerType(
                    type, []<typename T>() -> Handler { return &unaryHandler<T, Bfind<T, true>>; })
              : byIntegerType(type, []<typename T>() -> Handler {
                  return &unaryHandler<T, Bfind<T, false>>;
                });
    }
  } else if (base == "and" || base == "or" || base == "xor") {
    if (!sources(2, {})) return false;
    if (base == "and")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, And<T>>; });
    if (base == "or")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Or<T>>; });
    if (base == "xor")
      handler =
          byIntegerType(type, []<typename T>() -> Handler { return &binaryHandler<T, T, Xor<T>>; });
  } else if (base == "shl" || base == "shr") {
    if (!sources(2, {type, Type::kU32})) return false;
    if (base == "shl")
      handler = byIntegerType(
          type, []<typename T>() -> Handler { return &binaryHandler<T, std::uint32_t, Shl<T>>; });
    if (base == "shr")
      handler = byIntegerType(
          type, []<typename T>() -> Handler { return &binaryHandler<T, std::uint32_t, Shr<T>>; });
  } else if (base == "bfe") {
    if (!sources(3, {type, Type::kU32, Type::kU32})) return false;
    handler = byIntegerType(type, []<typename T>() -> Handler {
      if constexpr (sizeof(T) >= 4) return &ternaryHandler<T, std::uint32_t, std::uint32_t, Bfe<T>>;
      return nullptr;
    });
  } else if (base == "bfi") {
    if (!sources(4, {type, type, Type::kU32, Type::kU32})) return false;
    handler = byIntegerType(type, []<typename T>() -> Handler {
      if constexpr (sizeof(T) >= 4)
        return &quaternaryHandler<T, T, std::uint32_t, std::uint32_t, Bfi<T>>;
      return nullptr;
    });
  } else if (base == "fns") {
    if (type != Type::kB32) return bindError(resolver, "fns needs .b32");
    if (!sources(3, {Type::kB32, Type::kU32, Type::kS32})) return false;
    handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::int32_t, Fns>;
  } else if (base == "lop3") {
    if (type != Type::kB32) return bindError(resolver, "lop3 needs .b32");
    if (!expectOperands(parsed, 5, resolver)) return false;
    if (!sources(4, {type, type, type, Type::kU32})) return false;
    handler = &quaternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, Lop3>;
  } else if (base == "prmt") {
    if (type != Type::kB32) return bindError(resolver, "prmt needs .b32");
    if (!sources(3, {})) return false;
    if (prmtMode.empty())
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Prmt>;
    if (prmtMode == "f4e")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<1>>;
    if (prmtMode == "b4e")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<2>>;
    if (prmtMode == "rc8")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<3>>;
    if (prmtMode == "ecl")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<4>>;
    if (prmtMode == "ecr")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<5>>;
    if (prmtMode == "rc16")
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, PrmtMode<6>>;
  } else if (base == "shf") {
    if (type != Type::kB32 || direction.empty() || clampMode.empty()) {
      return bindError(resolver, "shf needs .l/.r, .clamp/.wrap and .b32");
    }
    if (!sources(3, {Type::kB32, Type::kB32, Type::kU32})) return false;
    const bool left = direction == "l";
    const bool clamp = clampMode == "clamp";
    if (left && clamp)
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Shf<true, true>>;
    if (left && !clamp)
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Shf<true, false>>;
    if (!left && clamp)
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Shf<false, true>>;
    if (!left && !clamp)
      handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Shf<false, false>>;
  } else if (base == "dp4a" || base == "dp2a") {
    if (types.size() != 2) return bindError(resolver, "dp4a/dp2a need two types");
    const bool signedA = types[0] == Type::kS32;
    const bool signedB = types[1] == Type::kS32;
    if (!sources(3, {Type::kB32, Type::kB32, signedA || signedB ? Type::kS32 : Type::kU32}))
      return false;
    if (base == "dp4a") {
      if (signedA && signedB)
        handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Dp4a<true, true>>;
      if (signedA && !signedB)
        handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Dp4a<true, false>>;
      if (!signedA && signedB)
        handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Dp4a<false, true>>;
      if (!signedA && !signedB)
        handler = &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t, Dp4a<false, false>>;
    } else {
      const bool high = part == "hi";
      if (signedA && signedB)
        handler = high ? &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<true, true, true>>
                       : &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<true, true, false>>;
      if (signedA && !signedB)
        handler = high ? &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<true, false, true>>
                       : &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<true, false, false>>;
      if (!signedA && signedB)
        handler = high ? &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<false, true, true>>
                       : &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<false, true, false>>;
      if (!signedA && !signedB)
        handler = high ? &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<false, false, true>>
                       : &ternaryHandler<std::uint32_t, std::uint32_t, std::uint32_t,
                                         Dp2a<false, false, false>>;
    }
  } else if (base == "szext") {
    if (clampMode.empty() || (type != Type::kS32 && type != Type::kU32)) {
      return bindError(resolver, "szext needs .clamp/.wrap and .s32/.u32");
    }
    if (!sources(2, {type, Type::kU32})) return false;
    const bool clamp = clampMode == "clamp";
    if (isSigned) {
      handler = clamp ? &binaryHandler<std::uint32_t, std::uint32_t, Szext<true, true>>
                      : &binaryHandler<std::uint32_t, std::uint32_t, Szext<true, false>>;
    } else {
      handler = clamp ? &binaryHandler<std::uint32_t, std::uint32_t, Szext<false, true>>
                      : &binaryHandler<std::uint32_t, std::uint32_t, Szext<false, false>>;
    }
  } else if (base == "bmsk") {
    if (clampMode.empty() || type != Type::kB32)
      return bindError(resolver, "bmsk needs .clamp/.wrap .b32");
    if (!sources(2, {Type::kU32, Type::kU32})) return false;
    handler = clampMode == "clamp" ? &binaryHandler<std::uint32_t, std::uint32_t, Bmsk<true>>
                                   : &binaryHandler<std::uint32_t, std::uint32_t, Bmsk<false>>;
  } else {
    return unsupportedBinding(resolver, unsupported, "this integer instruction");
  }
  if (handler == nullptr) return unsupportedBinding(resolver, unsupported, "this type");
  instruction.handler = handler;
  return true;
}

}  // namespace gpuproxy::server::ptx
