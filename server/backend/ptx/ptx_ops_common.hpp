#pragma once
// Handler templates for element-wise instructions: one call per warp-instruction, a loop over the
// executing lanes inside. `Op` is a stateless struct with a static `apply`; the operand and result
// types come from it, so one template serves integers and floats.

#include <cstdint>

#include "server/backend/ptx/ptx_exec.hpp"

namespace gpuproxy::server::ptx {

// An instruction with nothing to do in the sim (hints, and waits for work already done).
inline bool nopHandler(ExecContext&, const Instruction&, std::uint32_t) {
  return true;
}

template <typename A, typename Op>
bool unaryHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = bitsOf(Op::apply(as<A>(a[lane]))); });
  return true;
}

template <typename A, typename B, typename Op>
bool binaryHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(Op::apply(as<A>(a[lane]), as<B>(b[lane])));
  });
  return true;
}

template <typename A, typename B, typename C, typename Op>
bool ternaryHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(Op::apply(as<A>(a[lane]), as<B>(b[lane]), as<C>(c[lane])));
  });
  return true;
}

template <typename A, typename B, typename C, typename E, typename Op>
bool quaternaryHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const std::uint64_t* c = context.row(instruction.op[3]);
  const std::uint64_t* e = context.row(instruction.op[4]);
  forLanes(mask, [&](std::uint32_t lane) {
    d[lane] = bitsOf(Op::apply(as<A>(a[lane]), as<B>(b[lane]), as<C>(c[lane]), as<E>(e[lane])));
  });
  return true;
}

// Comparisons, written to predicates: op[0] = predicate, op[1], op[2] = sources, op[3] = the
// predicate combined by .and/.or/.xor (flags bits 0-1: 0 none, 1 and, 2 or, 3 xor; bit 2: that
// predicate is negated), op[4] = the complement predicate (d|q) or none.
template <typename T, typename Cmp>
bool compareHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  std::uint32_t result = 0;
  std::uint32_t known = 0;  // lanes where the comparison is ordered (both not NaN)
  forLanes(mask, [&](std::uint32_t lane) {
    const bool value = Cmp::apply(as<T>(a[lane]), as<T>(b[lane]));
    result |= static_cast<std::uint32_t>(value) << lane;
    known |= 1u << lane;
  });
  (void)known;
  std::uint32_t complement = ~result;
  const unsigned combine = instruction.flags & 3;
  if (combine != 0) {
    std::uint32_t other = context.preds[instruction.op[3]];
    if ((instruction.flags & 4) != 0) other = ~other;
    switch (combine) {
      case 1:
        result &= other;
        complement &= other;
        break;
      case 2:
        result |= other;
        complement |= other;
        break;
      default:
        result ^= other;
        complement ^= other;
        break;
    }
  }
  std::uint32_t& p = context.preds[instruction.op[0]];
  p = (p & ~mask) | (result & mask);
  if (instruction.op[4] != kNoRegister) {
    std::uint32_t& q = context.preds[instruction.op[4]];
    q = (q & ~mask) | (complement & mask);
  }
  return true;
}

// set: a comparison written as a value (1.0f or all ones when true, 0 when false), combined like
// setp. flags bit 3: the result is a float (1.0f) rather than an integer mask.
template <typename T, typename Cmp, typename D>
bool setHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const std::uint64_t* b = context.row(instruction.op[2]);
  const unsigned combine = instruction.flags & 3;
  std::uint32_t other = combine != 0 ? context.preds[instruction.op[3]] : 0;
  if ((instruction.flags & 4) != 0) other = ~other;
  forLanes(mask, [&](std::uint32_t lane) {
    bool value = Cmp::apply(as<T>(a[lane]), as<T>(b[lane]));
    const bool c = ((other >> lane) & 1) != 0;
    if (combine == 1) value = value && c;
    if (combine == 2) value = value || c;
    if (combine == 3) value = value != c;
    if constexpr (std::is_same_v<D, float>) {
      d[lane] = bitsOf(value ? 1.0f : 0.0f);
    } else {
      d[lane] = bitsOf(static_cast<D>(value ? ~static_cast<D>(0) : 0));
    }
  });
  return true;
}

}  // namespace gpuproxy::server::ptx
