// SIMD video instructions: vadd2/4, vsub2/4, vavrg2/4, vabsdiff2/4, vmin2/4, vmax2/4 and
// vset2/4, with their operand selectors, saturation, lane masks and secondary accumulate or merge
// (PTX ISA, "SIMD Video Instructions"). nvcc emits vabsdiff4/vabsdiff2 for the __vabsdiff*,
// __vsad* and related intrinsics; the rest appear in hand-written inline assembly.
//
// The scalar video instructions (vadd, vmad, vshl, ... without a lane count) are not executed:
// they are refused by name (unsupportedFamily in ptx_bind.cpp).

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

enum class VideoOp : std::uint8_t { kAdd, kSub, kAverage, kAbsDiff, kMin, kMax, kSet };
enum class VideoCompare : std::uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };

// Everything an instruction's qualifiers and operand selectors say, packed into
// Instruction::immediate so that one handler serves every form.
struct VideoForm {
  VideoOp op = VideoOp::kAdd;
  VideoCompare compare = VideoCompare::kEq;
  bool bytes = true;  // four byte lanes (vop4), else two half-word lanes (vop2)
  bool signedA = false;
  bool signedB = false;
  bool signedD = false;
  bool saturate = false;
  bool accumulate = false;    // .add: d = c + the selected lanes' results
  std::uint8_t laneMask = 0;  // bit i: lane i takes part (destination's .bNNN/.hNN)
  std::uint16_t selectA = 0;  // nibble i: the source element lane i of a reads
  std::uint16_t selectB = 0;

  std::int64_t pack() const {
    std::uint64_t bits =
        static_cast<std::uint64_t>(op) | (static_cast<std::uint64_t>(compare) << 4);
    bits |= std::uint64_t{bytes} << 8 | std::uint64_t{signedA} << 9 | std::uint64_t{signedB} << 10;
    bits |= std::uint64_t{signedD} << 11 | std::uint64_t{saturate} << 12;
    bits |= std::uint64_t{accumulate} << 13 | std::uint64_t{laneMask} << 16;
    bits |= std::uint64_t{selectA} << 24 | std::uint64_t{selectB} << 40;
    return static_cast<std::int64_t>(bits);
  }
  static VideoForm unpack(std::int64_t packed) {
    const auto bits = static_cast<std::uint64_t>(packed);
    VideoForm form;
    form.op = static_cast<VideoOp>(bits & 0xf);
    form.compare = static_cast<VideoCompare>((bits >> 4) & 0xf);
    form.bytes = ((bits >> 8) & 1) != 0;
    form.signedA = ((bits >> 9) & 1) != 0;
    form.signedB = ((bits >> 10) & 1) != 0;
    form.signedD = ((bits >> 11) & 1) != 0;
    form.saturate = ((bits >> 12) & 1) != 0;
    form.accumulate = ((bits >> 13) & 1) != 0;
    form.laneMask = static_cast<std::uint8_t>((bits >> 16) & 0xff);
    form.selectA = static_cast<std::uint16_t>((bits >> 24) & 0xffff);
    form.selectB = static_cast<std::uint16_t>((bits >> 40) & 0xffff);
    return form;
  }
};

// Element `index` of the eight bytes (or four half-words) {b, a}, a in the low half, sign- or
// zero-extended.
std::int64_t element(std::uint32_t a, std::uint32_t b, unsigned index, bool bytes, bool isSigned) {
  const std::uint64_t both = (std::uint64_t{b} << 32) | a;
  const unsigned width = bytes ? 8 : 16;
  const std::uint64_t raw = (both >> (width * index)) & ((std::uint64_t{1} << width) - 1);
  if (isSigned && ((raw >> (width - 1)) & 1) != 0) {
    return static_cast<std::int64_t>(raw) - (std::int64_t{1} << width);
  }
  return static_cast<std::int64_t>(raw);
}

std::int64_t laneResult(const VideoForm& form, std::int64_t a, std::int64_t b) {
  switch (form.op) {
    case VideoOp::kAdd:
      return a + b;
    case VideoOp::kSub:
      return a - b;
    case VideoOp::kAverage: {
      // Rounds half away from zero for a non-negative sum, down otherwise.
      const std::int64_t sum = a + b;
      return sum >= 0 ? (sum + 1) >> 1 : sum >> 1;
    }
    case VideoOp::kAbsDiff:
      return a > b ? a - b : b - a;
    case VideoOp::kMin:
      return std::min(a, b);
    case VideoOp::kMax:
      return std::max(a, b);
    case VideoOp::kSet:
      switch (form.compare) {
        case VideoCompare::kEq:
          return a == b;
        case VideoCompare::kNe:
          return a != b;
        case VideoCompare::kLt:
          return a < b;
        case VideoCompare::kLe:
          return a <= b;
        case VideoCompare::kGt:
          return a > b;
        case VideoCompare::kGe:
          return a >= b;
      }
  }
  return 0;
}

std::uint32_t videoSimd(const VideoForm& form, std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  const unsigned lanes = form.bytes ? 4 : 2;
  const unsigned width = form.bytes ? 8 : 16;
  const std::uint32_t laneBits = (std::uint32_t{1} << width) - 1;
  std::uint32_t merged = 0;
  std::uint32_t accumulated = c;
  for (unsigned lane = 0; lane < lanes; ++lane) {
    const std::int64_t x =
        element(a, b, (form.selectA >> (4 * lane)) & 0xf, form.bytes, form.signedA);
    const std::int64_t y =
        element(a, b, (form.selectB >> (4 * lane)) & 0xf, form.bytes, form.signedB);
    std::int64_t t = laneResult(form, x, y);
    if (form.saturate) {
      const std::int64_t high = form.signedD ? (laneBits >> 1) : laneBits;
      const std::int64_t low = form.signedD ? -static_cast<std::int64_t>(laneBits >> 1) - 1 : 0;
      t = std::clamp(t, low, high);
    }
    const bool selected = ((form.laneMask >> lane) & 1) != 0;
    if (form.accumulate) {
      if (selected) accumulated += static_cast<std::uint32_t>(t);
    } else {
      const std::uint32_t bits =
          selected ? static_cast<std::uint32_t>(t) & laneBits : (c >> (width * lane)) & laneBits;
      merged |= bits << (width * lane);
    }
  }
  return form.accumulate ? accumulated : merged;
}

bool videoSimdHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const VideoForm form = VideoForm::unpack(instruction.immediate);
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = videoSimd(form, static_cast<std::uint32_t>(a[lane]),
                        static_cast<std::uint32_t>(b[lane]), static_cast<std::uint32_t>(c[lane]));
  });
  return true;
}

// A register operand with its selector split off: "%r1.b3210" -> "%r1" and "b3210".
std::string splitSelector(Operand& operand) {
  if (operand.kind != Operand::Kind::kRegister) return {};
  const std::size_t dot = operand.name.find('.');
  if (dot == std::string::npos) return {};
  std::string selector = operand.name.substr(dot + 1);
  operand.name.resize(dot);
  return selector;
}

// An operand selector, .bxyzw (bytes, digits 0-7) or .hxy (half-words, digits 0-3), the digits
// naming lanes from the highest down; packed as nibble i = the element lane i reads.
bool parseSelector(std::string_view selector, bool bytes, std::uint16_t& packed) {
  const unsigned lanes = bytes ? 4 : 2;
  const char prefix = bytes ? 'b' : 'h';
  if (selector.size() != lanes + 1 || selector[0] != prefix) return false;
  packed = 0;
  for (unsigned lane = 0; lane < lanes; ++lane) {
    const char digit = selector[lanes - lane];
    if (digit < '0' || digit >= static_cast<char>('0' + 2 * lanes)) return false;
    packed |= static_cast<std::uint16_t>(digit - '0') << (4 * lane);
  }
  return true;
}

// The destination's lane mask: .b0, .b10, .b3210, ... or .h0, .h1, .h10 (digits from the highest
// lane down, each at most once).
bool parseLaneMask(std::string_view selector, bool bytes, std::uint8_t& mask) {
  const unsigned lanes = bytes ? 4 : 2;
  const char prefix = bytes ? 'b' : 'h';
  if (selector.size() < 2 || selector.size() > lanes + 1 || selector[0] != prefix) return false;
  mask = 0;
  int previous = static_cast<int>(lanes);
  for (const char digit : selector.substr(1)) {
    const int lane = digit - '0';
    if (lane < 0 || lane >= previous) return false;
    mask |= static_cast<std::uint8_t>(1u << lane);
    previous = lane;
  }
  return true;
}

}  // namespace

bool isVideoOpcode(std::string_view base) {
  static constexpr std::string_view kOpcodes[] = {
      "vadd2", "vsub2", "vavrg2", "vabsdiff2", "vmin2", "vmax2", "vset2",
      "vadd4", "vsub4", "vavrg4", "vabsdiff4", "vmin4", "vmax4", "vset4"};
  return std::find(std::begin(kOpcodes), std::end(kOpcodes), base) != std::end(kOpcodes);
}

bool bindVideo(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
               Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  VideoForm form;
  form.bytes = base.back() == '4';
  const std::string_view name = base.substr(0, base.size() - 1);
  if (name == "vadd") form.op = VideoOp::kAdd;
  if (name == "vsub") form.op = VideoOp::kSub;
  if (name == "vavrg") form.op = VideoOp::kAverage;
  if (name == "vabsdiff") form.op = VideoOp::kAbsDiff;
  if (name == "vmin") form.op = VideoOp::kMin;
  if (name == "vmax") form.op = VideoOp::kMax;
  if (name == "vset") form.op = VideoOp::kSet;
  if (form.op == VideoOp::kSet) {
    const std::string_view compare = qualifiers.takeAny({"eq", "ne", "lt", "le", "gt", "ge"});
    if (compare.empty()) return bindError(resolver, std::string(base) + " needs a comparison");
    static constexpr std::string_view kCompares[] = {"eq", "ne", "lt", "le", "gt", "ge"};
    form.compare = static_cast<VideoCompare>(
        std::find(std::begin(kCompares), std::end(kCompares), compare) - std::begin(kCompares));
  }
  form.accumulate = qualifiers.take("add");
  form.saturate = form.op != VideoOp::kSet && qualifiers.take("sat");
  if (form.accumulate && form.saturate) {
    return bindError(resolver, std::string(base) + ": .sat cannot be used with .add");
  }
  const std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  // vop: .dtype.atype.btype; vset: .atype.btype (its results are unsigned).
  const std::size_t typeCount = form.op == VideoOp::kSet ? 2 : 3;
  if (types.size() != typeCount || !std::all_of(types.begin(), types.end(), [](Type type) {
        return type == Type::kU32 || type == Type::kS32;
      })) {
    return bindError(resolver, std::string(base) + " needs " + std::to_string(typeCount) +
                                   " types, each .u32 or .s32");
  }
  const std::size_t firstSource = typeCount - 2;
  form.signedD = typeCount == 3 && types[0] == Type::kS32;
  form.signedA = types[firstSource] == Type::kS32;
  form.signedB = types[firstSource + 1] == Type::kS32;
  if (!expectOperands(parsed, 4, resolver)) return false;

  std::array<Operand, 4> operands = {parsed.operands[0], parsed.operands[1], parsed.operands[2],
                                     parsed.operands[3]};
  const std::string maskText = splitSelector(operands[0]);
  form.laneMask = form.bytes ? 0xf : 0x3;
  if (!maskText.empty() && !parseLaneMask(maskText, form.bytes, form.laneMask)) {
    return bindError(resolver, std::string(base) + ": bad lane mask ." + maskText);
  }
  // Defaults: a's own elements for a, b's for b (.b3210/.b7654, .h10/.h32).
  form.selectA = form.bytes ? 0x3210 : 0x10;
  form.selectB = form.bytes ? 0x7654 : 0x32;
  for (int source = 1; source <= 2; ++source) {
    const std::string selectorText = splitSelector(operands[source]);
    std::uint16_t& select = source == 1 ? form.selectA : form.selectB;
    if (!selectorText.empty() && !parseSelector(selectorText, form.bytes, select)) {
      return bindError(resolver, std::string(base) + ": bad operand selector ." + selectorText);
    }
  }
  if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver)) return false;
  for (int source = 1; source <= 3; ++source) {
    if (!bindSource(instruction, source, operands[source], Type::kB32, resolver)) return false;
  }
  instruction.immediate = form.pack();
  instruction.handler = &videoSimdHandler;
  return true;
}

}  // namespace gpuproxy::server::ptx
