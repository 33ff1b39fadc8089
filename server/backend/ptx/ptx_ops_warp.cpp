// Warp-level instructions: shfl.sync, vote.sync, match.sync, redux.sync, elect.sync,
// activemask, bar.warp.sync. The interpreter runs a *.sync instruction only once every lane of
// its member mask that has not exited is in the executing group (Flow::kWarpSync; `target` names
// the operand holding the member mask), so a handler sees the whole exchange at once.

#include <bit>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

// The lanes `lane` exchanges with: its member mask (the operand `target` names) among the lanes
// executing. Lanes of one instruction may name different masks (cooperative_groups tiles: each
// tile of 16 names its own half of the warp), and each exchange stays within its own.
inline std::uint32_t membersOf(ExecContext& context, const Instruction& instruction,
                               std::uint32_t mask, std::uint32_t lane) {
  return static_cast<std::uint32_t>(context.row(instruction.op[instruction.target])[lane]) & mask;
}

// shfl.sync.mode.b32 d|p, a, b, c, membermask: op[0] d, op[1] a, op[2] b, op[3] c,
// op[4] membermask, op[5] p (or none). flags: the mode (0 up, 1 down, 2 bfly, 3 idx).
template <int Mode>
bool shuffleHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  std::uint32_t source[kWarpSize];
  std::uint32_t valid = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const auto bval = static_cast<std::int32_t>(b[lane] & 31);
    const auto cval = static_cast<std::int32_t>(c[lane] & 31);
    const auto segment = static_cast<std::int32_t>((c[lane] >> 8) & 31);
    const auto self = static_cast<std::int32_t>(lane);
    const std::int32_t maxLane = (self & segment) | (cval & ~segment);
    const std::int32_t minLane = self & segment;
    std::int32_t j = 0;
    bool ok = false;
    switch (Mode) {
      case 0:
        j = self - bval;
        ok = j >= maxLane;
        break;
      case 1:
        j = self + bval;
        ok = j <= maxLane;
        break;
      case 2:
        j = self ^ bval;
        ok = j <= maxLane;
        break;
      default:
        j = minLane | (bval & ~segment);
        ok = j <= maxLane;
        break;
    }
    if (!ok || j < 0 || j > 31) j = self;
    source[lane] = static_cast<std::uint32_t>(j);
    valid |= static_cast<std::uint32_t>(ok) << lane;
  });
  // Read every source before writing any destination: d may be a.
  std::uint64_t values[kWarpSize];
  forLanes(mask, [&](std::uint32_t lane) { values[lane] = a[source[lane]] & 0xffffffffu; });
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = values[lane]; });
  if (instruction.op[5] != kNoRegister) {
    std::uint32_t& p = context.preds[instruction.op[5]];
    p = (p & ~mask) | (valid & mask);
  }
  return true;
}

// vote.sync.{all,any,uni}.pred d, {!}a, membermask (op[0] d predicate, op[1] a predicate,
// op[2] membermask; flags bit 2: a negated); vote.sync.ballot.b32 d (a row), a, membermask.
template <int Mode>  // 0 all, 1 any, 2 uni, 3 ballot
bool voteHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint32_t a = context.preds[instruction.op[1]];
  if ((instruction.flags & 4) != 0) a = ~a;
  if (Mode == 3) {
    std::uint64_t* d = context.row(instruction.op[0]);
    std::uint32_t ballots[kWarpSize];
    forLanes(mask, [&](std::uint32_t lane) {
      ballots[lane] = a & membersOf(context, instruction, mask, lane);
    });
    forLanes(mask, [&](std::uint32_t lane) { d[lane] = ballots[lane]; });
    return true;
  }
  std::uint32_t results = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint32_t members = membersOf(context, instruction, mask, lane);
    const std::uint32_t votes = a & members;
    bool result = false;
    if (Mode == 0) result = votes == members;
    if (Mode == 1) result = votes != 0;
    if (Mode == 2) result = votes == 0 || votes == members;
    results |= static_cast<std::uint32_t>(result) << lane;
  });
  std::uint32_t& d = context.preds[instruction.op[0]];
  d = (d & ~mask) | (results & mask);
  return true;
}

// match.any.sync.b32/b64 d, a, membermask; match.all.sync d|p, a, membermask
// (op[0] d, op[1] a, op[2] membermask, op[5] p).
template <typename T, bool All>
bool matchHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  T values[kWarpSize];
  forLanes(mask, [&](std::uint32_t lane) { values[lane] = static_cast<T>(a[lane]); });
  std::uint32_t allEqual = 0;  // lanes whose whole member mask holds one value
  std::uint32_t result[kWarpSize];
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint32_t members = membersOf(context, instruction, mask, lane);
    std::uint32_t same = 0;
    forLanes(members, [&](std::uint32_t other) {
      if (values[other] == values[lane]) same |= 1u << other;
    });
    const bool all = same == members;
    allEqual |= static_cast<std::uint32_t>(all) << lane;
    result[lane] = All ? (all ? members : 0) : same;
  });
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = result[lane]; });
  if (All && instruction.op[5] != kNoRegister) {
    std::uint32_t& p = context.preds[instruction.op[5]];
    p = (p & ~mask) | (allEqual & mask);
  }
  return true;
}

// redux's operation over the lanes of `members`.
template <typename T, int Op>
T reduce(const std::uint64_t* a, std::uint32_t members) {
  bool first = true;
  T total = 0;
  forLanes(members, [&](std::uint32_t lane) {
    const T value = static_cast<T>(a[lane]);
    if (first) {
      total = value;
      first = false;
      return;
    }
    switch (Op) {
      case 0:
        total =
            static_cast<T>(static_cast<std::uint32_t>(total) + static_cast<std::uint32_t>(value));
        break;
      case 1:
        total = value < total ? value : total;
        break;
      case 2:
        total = value > total ? value : total;
        break;
      case 3:
        total = total & value;
        break;
      case 4:
        total = total | value;
        break;
      default:
        total = total ^ value;
        break;
    }
  });
  return total;
}

// redux.sync.op.type d, a, membermask (op[0], op[1], op[2]).
template <typename T, int Op>  // 0 add 1 min 2 max 3 and 4 or 5 xor
bool reduxHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  T totals[kWarpSize];
  std::uint32_t done = 0;  // lanes whose total is known
  forLanes(mask, [&](std::uint32_t lane) {
    if ((done >> lane) & 1u) return;
    const std::uint32_t members = membersOf(context, instruction, mask, lane);
    const T total = reduce<T, Op>(a, members);
    // Every lane naming the same members shares the total (usually the whole group at once).
    forLanes(mask & ~done, [&](std::uint32_t other) {
      if (membersOf(context, instruction, mask, other) == members) {
        totals[other] = total;
        done |= 1u << other;
      }
    });
  });
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = bitsOf(totals[lane]); });
  return true;
}

// elect.sync d|p, membermask: the lowest executing lane of each lane's member mask is elected
// (op[0] d, op[5] p).
bool electHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint32_t leaders[kWarpSize];
  std::uint32_t elected = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint32_t members = membersOf(context, instruction, mask, lane);
    leaders[lane] = members == 0 ? lane : static_cast<std::uint32_t>(std::countr_zero(members));
    if (leaders[lane] == lane) elected |= 1u << lane;
  });
  if (instruction.op[0] != kNoRegister) {
    std::uint64_t* d = context.row(instruction.op[0]);
    forLanes(mask, [&](std::uint32_t lane) { d[lane] = leaders[lane]; });
  }
  if (instruction.op[5] != kNoRegister) {
    std::uint32_t& p = context.preds[instruction.op[5]];
    p = (p & ~mask) | (elected & mask);
  }
  return true;
}

bool activemaskHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint32_t active = context.groupMask;
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = active; });
  return true;
}

bool warpSyncHandler(ExecContext&, const Instruction&, std::uint32_t) {
  return true;
}

}  // namespace

bool bindWarp(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  const std::vector<Operand>& operands = parsed.operands;
  if (base == "activemask") {
    qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 1, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver)) return false;
    instruction.handler = &activemaskHandler;
    return true;
  }
  const bool sync = qualifiers.take("sync");
  qualifiers.take("aligned");
  if (!sync) return unsupportedBinding(resolver, unsupported, "warp instructions without .sync");
  instruction.flow = Flow::kWarpSync;
  auto pairedPredicate = [&](const Operand& operand) {
    if (!operand.pairedPredicate) return true;
    Operand paired;
    paired.kind = Operand::Kind::kRegister;
    paired.name = *operand.pairedPredicate;
    return bindPredicate(instruction, 5, paired, resolver);
  };
  if (base == "shfl") {
    const std::string_view mode = qualifiers.takeAny({"up", "down", "bfly", "idx"});
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (mode.empty() || types.size() != 1 || types[0] != Type::kB32) {
      return bindError(resolver, "shfl.sync needs a mode and .b32");
    }
    if (!expectOperands(parsed, 5, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver) ||
        !pairedPredicate(operands[0]) ||
        !bindSource(instruction, 1, operands[1], Type::kB32, resolver) ||
        !bindSource(instruction, 2, operands[2], Type::kU32, resolver) ||
        !bindSource(instruction, 3, operands[3], Type::kU32, resolver) ||
        !bindSource(instruction, 4, operands[4], Type::kU32, resolver)) {
      return false;
    }
    instruction.target = 4;
    if (mode == "up") instruction.handler = &shuffleHandler<0>;
    if (mode == "down") instruction.handler = &shuffleHandler<1>;
    if (mode == "bfly") instruction.handler = &shuffleHandler<2>;
    if (mode == "idx") instruction.handler = &shuffleHandler<3>;
    return true;
  }
  if (base == "vote") {
    const std::string_view mode = qualifiers.takeAny({"all", "any", "uni", "ballot"});
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (mode.empty() || types.size() != 1) return bindError(resolver, "vote.sync needs a mode");
    if (!expectOperands(parsed, 3, resolver)) return false;
    const bool ballot = mode == "ballot";
    if (ballot ? types[0] != Type::kB32 : types[0] != Type::kPred) {
      return bindError(resolver, "vote.sync type");
    }
    if (ballot) {
      if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver)) return false;
    } else if (!bindPredicate(instruction, 0, operands[0], resolver)) {
      return false;
    }
    if (!bindPredicate(instruction, 1, operands[1], resolver) ||
        !bindSource(instruction, 2, operands[2], Type::kU32, resolver)) {
      return false;
    }
    if (operands[1].negated) instruction.flags |= 4;
    instruction.target = 2;
    if (mode == "all") instruction.handler = &voteHandler<0>;
    if (mode == "any") instruction.handler = &voteHandler<1>;
    if (mode == "uni") instruction.handler = &voteHandler<2>;
    if (mode == "ballot") instruction.handler = &voteHandler<3>;
    return true;
  }
  if (base == "match") {
    const std::string_view mode = qualifiers.takeAny({"any", "all"});
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (mode.empty() || types.size() != 1 || (types[0] != Type::kB32 && types[0] != Type::kB64)) {
      return bindError(resolver, "match.sync needs .any/.all and .b32/.b64");
    }
    if (!expectOperands(parsed, 3, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver) ||
        !pairedPredicate(operands[0]) ||
        !bindSource(instruction, 1, operands[1], types[0], resolver) ||
        !bindSource(instruction, 2, operands[2], Type::kU32, resolver)) {
      return false;
    }
    instruction.target = 2;
    const bool all = mode == "all";
    if (types[0] == Type::kB32) {
      instruction.handler =
          all ? &matchHandler<std::uint32_t, true> : &matchHandler<std::uint32_t, false>;
    } else {
      instruction.handler =
          all ? &matchHandler<std::uint64_t, true> : &matchHandler<std::uint64_t, false>;
    }
    return true;
  }
  if (base == "redux") {
    const std::string_view op = qualifiers.takeAny({"add", "min", "max", "and", "or", "xor"});
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (op.empty() || types.size() != 1) return bindError(resolver, "redux.sync needs an op");
    if (!expectOperands(parsed, 3, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], types[0], resolver) ||
        !bindSource(instruction, 1, operands[1], types[0], resolver) ||
        !bindSource(instruction, 2, operands[2], Type::kU32, resolver)) {
      return false;
    }
    instruction.target = 2;
    const bool isSignedType = types[0] == Type::kS32;
    if (types[0] != Type::kU32 && types[0] != Type::kS32 && types[0] != Type::kB32) {
      return unsupportedBinding(resolver, unsupported, "redux.sync of this type");
    }
    if (op == "add")
      instruction.handler =
          isSignedType ? &reduxHandler<std::int32_t, 0> : &reduxHandler<std::uint32_t, 0>;
    if (op == "min")
      instruction.handler =
          isSignedType ? &reduxHandler<std::int32_t, 1> : &reduxHandler<std::uint32_t, 1>;
    if (op == "max")
      instruction.handler =
          isSignedType ? &reduxHandler<std::int32_t, 2> : &reduxHandler<std::uint32_t, 2>;
    if (op == "and") instruction.handler = &reduxHandler<std::uint32_t, 3>;
    if (op == "or") instruction.handler = &reduxHandler<std::uint32_t, 4>;
    if (op == "xor") instruction.handler = &reduxHandler<std::uint32_t, 5>;
    return true;
  }
  if (base == "elect") {
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (operands[0].kind == Operand::Kind::kSink) {
      instruction.op[0] = kNoRegister;
    } else if (!bindDestination(instruction, 0, operands[0], Type::kB32, resolver)) {
      return false;
    }
    if (!pairedPredicate(operands[0]) ||
        !bindSource(instruction, 1, operands[1], Type::kU32, resolver)) {
      return false;
    }
    instruction.target = 1;
    instruction.handler = &electHandler;
    return true;
  }
  return unsupportedBinding(resolver, unsupported, "this warp instruction");
}

// bar.warp.sync is bound by the control family; its handler lives here.
Handler warpSyncNoOp() {
  return &warpSyncHandler;
}

}  // namespace gpuproxy::server::ptx
