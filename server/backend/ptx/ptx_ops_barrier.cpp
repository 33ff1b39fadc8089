// mbarrier objects: the split arrive/wait barriers in shared memory that cuda::barrier (and
// cuda::memcpy_async completing on one) compile to on compute capability 8.0 and later.
//
// The object is 64 bits of the block's shared memory, opaque to programs; here it holds the
// arrivals the current phase still waits for (bits 0-19), the arrivals each phase expects
// (bits 20-39) and the phase's number (bits 40-63). A phase completes when its pending count
// reaches zero: the number goes up and the pending count starts again from the expected one. An
// arrive returns the object as it was before (its phase is what test_wait/try_wait ask about).
// Only the block's own threads reach its shared memory, and they run one warp at a time, so the
// object needs no atomics. cp.async copies are done when issued (ptx_ops_memory.cpp), so
// cp.async.mbarrier.arrive arrives at once. Transaction counts (expect_tx, complete_tx: TMA) and
// barriers of other blocks of a cluster are refused, with the rest of TMA and clusters.

#include <cstring>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

constexpr std::uint64_t kCountMask = (1u << 20) - 1;
constexpr unsigned kExpectedShift = 20;
constexpr unsigned kPhaseShift = 40;

std::uint64_t pendingOf(std::uint64_t word) {
  return word & kCountMask;
}
std::uint64_t expectedOf(std::uint64_t word) {
  return (word >> kExpectedShift) & kCountMask;
}
std::uint64_t phaseOf(std::uint64_t word) {
  return word >> kPhaseShift;
}
std::uint64_t makeWord(std::uint64_t pending, std::uint64_t expected, std::uint64_t phase) {
  return (pending & kCountMask) | ((expected & kCountMask) << kExpectedShift) |
         (phase << kPhaseShift);
}

// The object of lane `lane`, or nullptr after a fault.
std::byte* barrierAt(ExecContext& context, const Instruction& instruction, std::uint32_t lane,
                     bool write) {
  const std::uint64_t address = addressOf(instruction, context.row(instruction.op[4]), lane);
  return translate(context, static_cast<Space>(instruction.space), address, 8, 8, lane, write);
}

std::uint64_t readWord(const std::byte* where) {
  std::uint64_t word;
  std::memcpy(&word, where, sizeof word);
  return word;
}

void writeWord(std::byte* where, std::uint64_t word) {
  std::memcpy(where, &word, sizeof word);
}

// mbarrier.init [addr], count: op[1] the count.
bool initHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* count = context.row(instruction.op[1]);
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    std::byte* where = barrierAt(context, instruction, lane, true);
    if (where == nullptr) return false;
    const std::uint64_t expected = static_cast<std::uint32_t>(count[lane]) & kCountMask;
    writeWord(where, makeWord(expected, expected, 0));
    return true;
  });
}

bool invalidateHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    std::byte* where = barrierAt(context, instruction, lane, true);
    if (where == nullptr) return false;
    writeWord(where, 0);
    return true;
  });
}

// One arrival of `count` on the object at `where`; `drop` also lowers what later phases expect.
// Returns the object as it was.
std::uint64_t arrive(std::byte* where, std::uint64_t count, bool drop) {
  const std::uint64_t before = readWord(where);
  std::uint64_t expected = expectedOf(before);
  if (drop) expected -= std::min(count, expected);
  std::uint64_t pending = pendingOf(before) - std::min(count, pendingOf(before));
  std::uint64_t phase = phaseOf(before);
  if (pending == 0) {
    ++phase;
    pending = expected;
  }
  writeWord(where, makeWord(pending, expected, phase));
  return before;
}

// mbarrier.arrive[_drop] state, [addr][, count]: op[0] the state (or a sink), op[1] the count
// (a constant 1 when not written).
template <bool Drop>
bool arriveHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* state = context.row(instruction.op[0]);
  const std::uint64_t* count = context.row(instruction.op[1]);
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    std::byte* where = barrierAt(context, instruction, lane, true);
    if (where == nullptr) return false;
    state[lane] = arrive(where, static_cast<std::uint32_t>(count[lane]), Drop);
    return true;
  });
}

// cp.async.mbarrier.arrive.noinc [addr]: the copies before it are done, so it arrives now.
// (Without .noinc the object's pending count goes up by one first and back down when the
// copies complete: nothing changes, and that form binds to nopHandler.)
bool copiesArriveHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    std::byte* where = barrierAt(context, instruction, lane, true);
    if (where == nullptr) return false;
    arrive(where, 1, false);
    return true;
  });
}

// mbarrier.test_wait/try_wait p, [addr], state (or .parity p, [addr], parity): op[0] the
// predicate, op[1] the state or parity.
template <bool Parity>
bool testWaitHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* asked = context.row(instruction.op[1]);
  std::uint32_t complete = 0;
  const bool ok = forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::byte* where = barrierAt(context, instruction, lane, false);
    if (where == nullptr) return false;
    const std::uint64_t phase = phaseOf(readWord(where));
    // A phase of the asked parity has completed when the current phase's parity differs.
    const bool done = Parity ? (phase & 1) != (asked[lane] & 1) : phase != phaseOf(asked[lane]);
    if (done) complete |= 1u << lane;
    return true;
  });
  if (!ok) return false;
  std::uint32_t& p = context.preds[instruction.op[0]];
  p = (p & ~mask) | (complete & mask);
  return true;
}

bool pendingCountHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* state = context.row(instruction.op[1]);
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = pendingOf(state[lane]); });
  return true;
}

bool bindBarrierAddress(Instruction& instruction, const Operand& operand, Space space,
                        OperandResolver& resolver) {
  if (!bindAddress(instruction, operand, space, resolver)) return false;
  instruction.space = static_cast<std::uint8_t>(space);
  instruction.flow = Flow::kMemory;
  return true;
}

// .shared / .shared::cta or generic; .shared::cluster names another block's object.
bool takeBarrierSpace(Qualifiers& qualifiers, Space& space, OperandResolver& resolver,
                      bool& unsupported) {
  if (qualifiers.take("shared::cluster")) {
    return unsupportedBinding(resolver, unsupported, "thread-block clusters");
  }
  space = (qualifiers.take("shared") || qualifiers.take("shared::cta")) ? Space::kShared
                                                                        : Space::kGeneric;
  return true;
}

}  // namespace

bool bindAsyncBarrier(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                      OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const std::vector<Operand>& operands = parsed.operands;
  const bool copies = qualifiers.base() == "cp";  // cp.async.mbarrier.arrive
  if (copies) {
    qualifiers.take("async");
    qualifiers.take("mbarrier");
  }
  if (qualifiers.take("expect_tx") || qualifiers.take("complete_tx")) {
    return unsupportedBinding(resolver, unsupported,
                              "mbarrier transaction counts (TMA, bulk asynchronous copies)");
  }
  const std::string_view operation = qualifiers.takeAny(
      {"init", "inval", "arrive", "arrive_drop", "test_wait", "try_wait", "pending_count"});
  if (operation.empty()) {
    return unsupportedBinding(resolver, unsupported,
                              "mbarrier objects (asynchronous transaction barriers)");
  }
  const bool noIncrement = qualifiers.take("noinc");
  const bool parity = qualifiers.take("parity");
  qualifiers.take("noComplete");  // a promise the arrival does not complete the phase
  Space space = Space::kGeneric;
  if (!takeBarrierSpace(qualifiers, space, resolver, unsupported)) return false;
  qualifiers.takeOrderingAndHints();  // .release/.acquire/.relaxed, .cta/.cluster scope
  qualifiers.take("b64");
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;

  if (copies) {
    if (operation != "arrive" || !expectOperands(parsed, 1, resolver)) {
      return bindError(resolver, "cp.async.mbarrier.arrive takes [addr]");
    }
    if (!bindBarrierAddress(instruction, operands[0], space, resolver)) return false;
    instruction.handler = noIncrement ? &copiesArriveHandler : &nopHandler;
    return true;
  }
  if (operation == "init" || operation == "inval") {
    const bool init = operation == "init";
    if (!expectOperands(parsed, init ? 2 : 1, resolver)) return false;
    if (!bindBarrierAddress(instruction, operands[0], space, resolver)) return false;
    if (init && !bindSource(instruction, 1, operands[1], Type::kU32, resolver)) return false;
    instruction.handler = init ? &initHandler : &invalidateHandler;
    return true;
  }
  if (operation == "arrive" || operation == "arrive_drop") {
    if (operands.size() != 2 && operands.size() != 3) {
      return bindError(resolver, "mbarrier.arrive takes state, [addr] and an optional count");
    }
    if (!bindDestination(instruction, 0, operands[0], Type::kB64, resolver) ||
        !bindBarrierAddress(instruction, operands[1], space, resolver)) {
      return false;
    }
    if (operands.size() == 3) {
      if (!bindSource(instruction, 1, operands[2], Type::kU32, resolver)) return false;
    } else {
      instruction.op[1] = resolver.constant(1);
    }
    instruction.handler = operation == "arrive" ? &arriveHandler<false> : &arriveHandler<true>;
    return true;
  }
  if (operation == "pending_count") {
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (!bindDestination(instruction, 0, operands[0], Type::kU32, resolver) ||
        !bindSource(instruction, 1, operands[1], Type::kB64, resolver)) {
      return false;
    }
    instruction.handler = &pendingCountHandler;
    return true;
  }
  // test_wait / try_wait: a try_wait may wait a while on a GPU before answering false; here it
  // answers at once, and the program's loop asks again (other warps run in between).
  if (operands.size() != 3 && !(operation == "try_wait" && operands.size() == 4)) {
    return bindError(resolver, "mbarrier." + std::string(operation) +
                                   " takes a predicate, [addr] and a state or parity");
  }
  if (!bindPredicate(instruction, 0, operands[0], resolver) ||
      !bindBarrierAddress(instruction, operands[1], space, resolver) ||
      !bindSource(instruction, 1, operands[2], parity ? Type::kU32 : Type::kB64, resolver)) {
    return false;
  }
  instruction.handler = parity ? &testWaitHandler<true> : &testWaitHandler<false>;
  return true;
}

}  // namespace gpuproxy::server::ptx
