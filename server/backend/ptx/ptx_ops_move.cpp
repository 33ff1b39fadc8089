// mov (registers, immediates, addresses, special registers, packing and unpacking) and the
// control instructions, which the interpreter itself executes (ptx_interpreter.cpp): their binding
// only records targets and operands.

#include <chrono>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_interpreter.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {

Handler warpSyncNoOp();

namespace {

bool copyHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  if (mask == 0xffffffffu) {
    std::memcpy(d, a, kWarpSize * sizeof(std::uint64_t));
  } else {
    forLanes(mask, [&](std::uint32_t lane) { d[lane] = a[lane]; });
  }
  return true;
}

bool predicateCopyHandler(ExecContext& context, const Instruction& instruction,
                          std::uint32_t mask) {
  std::uint32_t& d = context.preds[instruction.op[0]];
  const std::uint32_t value = context.preds[instruction.op[1]];
  d = (d & ~mask) | (value & mask);
  return true;
}

bool predicateSetHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint32_t& d = context.preds[instruction.op[0]];
  d = instruction.immediate != 0 ? (d | mask) : (d & ~mask);
  return true;
}

// mov.bN d, {a, b, ...}: op[1..] elements of `width` bytes, the first the lowest.
bool packHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const unsigned bits = 8u * instruction.width;
  const std::uint64_t elementMask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  forLanes(mask, [&](std::uint32_t lane) {
    std::uint64_t value = 0;
    for (unsigned i = 0; i < instruction.vector; ++i) {
      value |= (context.row(instruction.op[1 + i])[lane] & elementMask) << (bits * i);
    }
    d[lane] = value;
  });
  return true;
}

// mov.bN {a, b, ...}, s: op[0..] destinations of `width` bytes, op[5] the source.
bool unpackHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* s = context.row(instruction.op[5]);
  const unsigned bits = 8u * instruction.width;
  const std::uint64_t elementMask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint64_t value = s[lane];
    for (unsigned i = 0; i < instruction.vector; ++i) {
      context.row(instruction.op[i])[lane] = (value >> (bits * i)) & elementMask;
    }
  });
  return true;
}

enum class Special : std::uint32_t {
  kTidX,
  kTidY,
  kTidZ,
  kNtidX,
  kNtidY,
  kNtidZ,
  kCtaidX,
  kCtaidY,
  kCtaidZ,
  kNctaidX,
  kNctaidY,
  kNctaidZ,
  kLaneid,
  kWarpid,
  kNwarpid,
  kSmid,
  kNsmid,
  kGridid,
  kClock,
  kClockHi,
  kClock64,
  kGlobaltimer,
  kGlobaltimerLo,
  kGlobaltimerHi,
  kLanemaskEq,
  kLanemaskLe,
  kLanemaskLt,
  kLanemaskGe,
  kLanemaskGt,
  kDynamicSmem,
  kTotalSmem,
  kGridWorkspaceHigh,  // %envreg1
  kGridWorkspaceLow,   // %envreg2
  kReservedSharedBegin,
  kReservedSharedEnd,
  kReservedSharedCap,
  kReservedShared0,
  kReservedShared1,
  kZero
};

std::optional<Special> specialRegister(std::string_view name) {
  static constexpr std::pair<std::string_view, Special> kNames[] = {
      {"%tid.x", Special::kTidX},
      {"%tid.y", Special::kTidY},
      {"%tid.z", Special::kTidZ},
      {"%ntid.x", Special::kNtidX},
      {"%ntid.y", Special::kNtidY},
      {"%ntid.z", Special::kNtidZ},
      {"%ctaid.x", Special::kCtaidX},
      {"%ctaid.y", Special::kCtaidY},
      {"%ctaid.z", Special::kCtaidZ},
      {"%nctaid.x", Special::kNctaidX},
      {"%nctaid.y", Special::kNctaidY},
      {"%nctaid.z", Special::kNctaidZ},
      {"%laneid", Special::kLaneid},
      {"%warpid", Special::kWarpid},
      {"%nwarpid", Special::kNwarpid},
      {"%smid", Special::kSmid},
      {"%nsmid", Special::kNsmid},
      {"%gridid", Special::kGridid},
      {"%clock", Special::kClock},
      {"%clock_hi", Special::kClockHi},
      {"%clock64", Special::kClock64},
      {"%globaltimer", Special::kGlobaltimer},
      {"%globaltimer_lo", Special::kGlobaltimerLo},
      {"%globaltimer_hi", Special::kGlobaltimerHi},
      {"%lanemask_eq", Special::kLanemaskEq},
      {"%lanemask_le", Special::kLanemaskLe},
      {"%lanemask_lt", Special::kLanemaskLt},
      {"%lanemask_ge", Special::kLanemaskGe},
      {"%lanemask_gt", Special::kLanemaskGt},
      {"%dynamic_smem_size", Special::kDynamicSmem},
      {"%total_smem_size", Special::kTotalSmem},
      {"%aggr_smem_size", Special::kTotalSmem},
      // A cooperative launch's grid barrier workspace, as cooperative_groups reads it from the
      // driver (0 outside one: grid_group::sync() then traps, as on a GPU).
      {"%envreg1", Special::kGridWorkspaceHigh},
      {"%envreg2", Special::kGridWorkspaceLow},
      {"%current_graph_exec", Special::kZero},
      // The reserved shared memory (cooperative groups' scratch for tiles of several warps).
      {"%reserved_smem_offset_begin", Special::kReservedSharedBegin},
      {"%reserved_smem_offset_end", Special::kReservedSharedEnd},
      {"%reserved_smem_offset_cap", Special::kReservedSharedCap},
      {"%reserved_smem_offset_0", Special::kReservedShared0},
      {"%reserved_smem_offset_1", Special::kReservedShared1}};
  for (const auto& [special, id] : kNames) {
    if (special == name) return id;
  }
  const std::string_view base = name.substr(0, name.find('.'));
  // Cluster registers never get here: bindInstruction() refuses them.
  if (base.substr(0, 3) == "%pm" || base.substr(0, 7) == "%envreg") return Special::kZero;
  return std::nullopt;
}

std::uint64_t nowNanoseconds() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

bool specialHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const auto id = static_cast<Special>(instruction.extra);
  std::uint64_t uniform = 0;
  switch (id) {
    case Special::kTidX:
    case Special::kTidY:
    case Special::kTidZ: {
      const std::uint32_t* tid =
          context.tid[static_cast<unsigned>(id) - static_cast<unsigned>(Special::kTidX)];
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = tid[lane]; });
      return true;
    }
    case Special::kLaneid:
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = lane; });
      return true;
    case Special::kLanemaskEq:
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = 1u << lane; });
      return true;
    case Special::kLanemaskLe:
      forLanes(mask,
               [&](std::uint32_t lane) { d[lane] = lane == 31 ? 0xffffffffu : (2u << lane) - 1; });
      return true;
    case Special::kLanemaskLt:
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = (1u << lane) - 1; });
      return true;
    case Special::kLanemaskGe:
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = ~((1u << lane) - 1); });
      return true;
    case Special::kLanemaskGt:
      forLanes(mask, [&](std::uint32_t lane) { d[lane] = lane == 31 ? 0 : ~((2u << lane) - 1); });
      return true;
    case Special::kNtidX:
      uniform = context.ntid[0];
      break;
    case Special::kNtidY:
      uniform = context.ntid[1];
      break;
    case Special::kNtidZ:
      uniform = context.ntid[2];
      break;
    case Special::kCtaidX:
      uniform = context.ctaid[0];
      break;
    case Special::kCtaidY:
      uniform = context.ctaid[1];
      break;
    case Special::kCtaidZ:
      uniform = context.ctaid[2];
      break;
    case Special::kNctaidX:
      uniform = context.nctaid[0];
      break;
    case Special::kNctaidY:
      uniform = context.nctaid[1];
      break;
    case Special::kNctaidZ:
      uniform = context.nctaid[2];
      break;
    case Special::kWarpid:
      uniform = context.warpIndex;
      break;
    case Special::kNwarpid:
      uniform = context.warpsPerBlock;
      break;
    case Special::kSmid:
      uniform = context.workerIndex;
      break;
    case Special::kGridWorkspaceHigh:
      uniform = context.gridWorkspace != nullptr ? context.gridWorkspace->begin >> 32 : 0;
      break;
    case Special::kGridWorkspaceLow:
      uniform = context.gridWorkspace != nullptr ? context.gridWorkspace->begin & 0xffffffffu : 0;
      break;
    case Special::kNsmid:
      uniform = context.workerCount;
      break;
    case Special::kGridid:
      uniform = 1;
      break;
    case Special::kClock:
      uniform = static_cast<std::uint32_t>(nowNanoseconds());
      break;
    case Special::kClockHi:
      uniform = static_cast<std::uint32_t>(nowNanoseconds() >> 32);
      break;
    case Special::kClock64:
    case Special::kGlobaltimer:
      uniform = nowNanoseconds();
      break;
    case Special::kGlobaltimerLo:
      uniform = static_cast<std::uint32_t>(nowNanoseconds());
      break;
    case Special::kGlobaltimerHi:
      uniform = static_cast<std::uint32_t>(nowNanoseconds() >> 32);
      break;
    case Special::kDynamicSmem:
      uniform = context.dynamicSharedBytes;
      break;
    case Special::kTotalSmem:
      uniform = context.sharedBytes;
      break;
    case Special::kReservedSharedBegin:
    case Special::kReservedShared0:
      uniform = context.reservedSharedOffset;
      break;
    case Special::kReservedSharedEnd:
      uniform = context.reservedSharedOffset + kReservedSharedBytes;
      break;
    case Special::kReservedSharedCap:
      uniform = kReservedSharedBytes;
      break;
    case Special::kReservedShared1:
      uniform = context.reservedSharedOffset + kReservedSharedBytes / 2;
      break;
    case Special::kZero:
      uniform = 0;
      break;
  }
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = uniform; });
  return true;
}

}  // namespace

bool bindMove(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported) {
  const std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (types.size() != 1) return bindError(resolver, "mov needs one type");
  if (!expectOperands(parsed, 2, resolver)) return false;
  const Type type = types[0];
  const Operand& destination = parsed.operands[0];
  const Operand& source = parsed.operands[1];
  if (type == Type::kPred) {
    if (!bindPredicate(instruction, 0, destination, resolver)) return false;
    if (source.kind == Operand::Kind::kInteger) {
      instruction.immediate = source.integer != 0 ? 1 : 0;
      instruction.handler = &predicateSetHandler;
      return true;
    }
    if (!bindPredicate(instruction, 1, source, resolver)) return false;
    instruction.handler = &predicateCopyHandler;
    return true;
  }
  const unsigned bytes = typeBytes(type);
  if (bytes > 8) return unsupportedBinding(resolver, unsupported, "128-bit mov");
  if (source.kind == Operand::Kind::kVector || destination.kind == Operand::Kind::kVector) {
    const bool pack = source.kind == Operand::Kind::kVector;
    const std::vector<Operand>& elements = pack ? source.elements : destination.elements;
    if (elements.size() != 2 && elements.size() != 4) return bindError(resolver, "mov vector size");
    if (bytes % elements.size() != 0 || bytes / elements.size() < 1) {
      return bindError(resolver, "mov vector size");
    }
    instruction.vector = static_cast<std::uint8_t>(elements.size());
    instruction.width = static_cast<std::uint8_t>(bytes / elements.size());
    const Type element = instruction.width == 4   ? Type::kB32
                         : instruction.width == 2 ? Type::kB16
                                                  : Type::kB8;
    if (pack) {
      if (!bindDestination(instruction, 0, destination, type, resolver)) return false;
      for (std::size_t i = 0; i < elements.size(); ++i) {
        if (!bindSource(instruction, static_cast<int>(1 + i), elements[i], element, resolver))
          return false;
      }
      instruction.handler = &packHandler;
    } else {
      for (std::size_t i = 0; i < elements.size(); ++i) {
        if (!bindDestination(instruction, static_cast<int>(i), elements[i], element, resolver))
          return false;
      }
      if (!bindSource(instruction, 5, source, type, resolver)) return false;
      instruction.handler = &unpackHandler;
    }
    return true;
  }
  if (!bindDestination(instruction, 0, destination, type, resolver)) return false;
  if (source.kind == Operand::Kind::kRegister) {
    if (const std::optional<Special> special = specialRegister(source.name)) {
      instruction.extra = static_cast<std::uint32_t>(*special);
      instruction.handler = &specialHandler;
      return true;
    }
  }
  if (!bindSource(instruction, 1, source, type, resolver)) return false;
  instruction.handler = &copyHandler;
  return true;
}

bool bindControl(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  const std::vector<Operand>& operands = parsed.operands;
  if (base == "bra") {
    qualifiers.take("uni");
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 1, resolver)) return false;
    const std::optional<std::uint32_t> label = resolver.label(operands[0]);
    if (!label) return false;
    instruction.flow = Flow::kBranch;
    instruction.target = *label;
    return true;
  }
  if (base == "call") {
    qualifiers.take("uni");
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    std::size_t index = 0;
    if (!operands.empty() && operands[0].kind == Operand::Kind::kVector &&
        operands[0].parenthesized) {
      index = 1;
    }
    if (index >= operands.size()) return bindError(resolver, "call without a target");
    const Operand& target = operands[index];
    instruction.flow = Flow::kCall;
    bool indirect = false;
    std::uint32_t callee = 0;
    if (target.kind == Operand::Kind::kRegister) {
      indirect = true;
      if (!bindSource(instruction, 0, target, Type::kU64, resolver)) return false;
    } else if (target.kind == Operand::Kind::kSymbol && target.integer == 0) {
      const std::optional<std::uint32_t> function = resolver.function(target.name);
      if (!function)
        return bindError(resolver, "call to undeclared function '" + target.name + "'");
      callee = *function;
    } else {
      return bindError(resolver, "bad call target");
    }
    const std::optional<std::uint32_t> site = resolver.callSite(parsed, callee, indirect);
    if (!site) return false;
    instruction.target = callee;
    instruction.extra = *site;
    return true;
  }
  if (base == "ret" || base == "exit" || base == "trap" || base == "brkpt" || base == "pmevent" ||
      base == "griddepcontrol") {
    qualifiers.take("uni");
    qualifiers.takeAny({"launch_dependents", "wait"});
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (base == "pmevent" || base == "griddepcontrol") {
      // Performance-monitor events, and programmatic dependent launch: kernels of a device run
      // one after the other on the sim, so a kernel's prerequisites are always complete.
      instruction.handler = &nopHandler;
      return true;
    }
    if (!operands.empty()) return bindError(resolver, "unexpected operands");
    instruction.flow = base == "ret"    ? Flow::kReturn
                       : base == "exit" ? Flow::kExit
                       : base == "trap" ? Flow::kTrap
                                        : Flow::kBreakpoint;
    return true;
  }
  if (base == "nanosleep") {
    qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 1, resolver)) return false;
    if (!bindSource(instruction, 0, operands[0], Type::kU32, resolver)) return false;
    instruction.flow = Flow::kSleep;
    return true;
  }
  if (base == "bar" || base == "barrier") {
    if (qualifiers.take("warp")) {
      qualifiers.take("sync");
      if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
      if (!expectOperands(parsed, 1, resolver)) return false;
      if (!bindSource(instruction, 0, operands[0], Type::kU32, resolver)) return false;
      instruction.flow = Flow::kWarpSync;
      instruction.target = 0;
      instruction.handler = warpSyncNoOp();
      return true;
    }
    qualifiers.take("cta");
    qualifiers.take("aligned");
    const std::string_view kind = qualifiers.takeAny({"sync", "arrive", "red"});
    std::string_view reduction;
    if (kind == "red") reduction = qualifiers.takeAny({"popc", "and", "or"});
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    // bar 0 (no .sync) is bar.sync 0.
    instruction.flow = Flow::kBarrier;
    std::size_t next = 0;
    if (kind == "red") {
      if (reduction.empty() || types.size() != 1) return bindError(resolver, "bar.red needs an op");
      if (reduction == "popc") {
        if (!bindDestination(instruction, 2, operands.at(0), Type::kU32, resolver)) return false;
        instruction.flags = 2;
      } else {
        if (!bindPredicate(instruction, 2, operands.at(0), resolver)) return false;
        instruction.flags = reduction == "and" ? 3 : 4;
      }
      next = 1;
    } else {
      instruction.flags = kind == "arrive" ? 1 : 0;
    }
    if (operands.size() <= next) return bindError(resolver, "barrier without an id");
    if (!bindSource(instruction, 0, operands[next++], Type::kU32, resolver)) return false;
    const std::size_t remaining = operands.size() - next;
    if (kind == "red") {
      if (remaining == 2) {
        if (!bindSource(instruction, 1, operands[next++], Type::kU32, resolver)) return false;
      } else if (remaining != 1) {
        return bindError(resolver, "bar.red operands");
      }
      if (!bindPredicate(instruction, 3, operands[next], resolver)) return false;
      if (operands[next].negated) instruction.flags |= 16;
    } else if (remaining == 1) {
      if (!bindSource(instruction, 1, operands[next], Type::kU32, resolver)) return false;
    } else if (remaining != 0) {
      return bindError(resolver, "barrier operands");
    } else if (kind == "arrive") {
      return bindError(resolver, "bar.arrive needs a thread count");
    }
    return true;
  }
  return unsupportedBinding(resolver, unsupported, "this control instruction");
}

}  // namespace gpuproxy::server::ptx
