// Memory instructions: ld, st, atom, red, cvta, isspacep, fences and the hints that change
// nothing on the sim. Every access is checked: against the launch's memory map for global and
// constant memory (the launching client's allocations, registered host memory and module
// variables), against the block's shared memory, the thread's local memory and the parameter
// space; a miss is CUDA_ERROR_ILLEGAL_ADDRESS and a misaligned access
// CUDA_ERROR_MISALIGNED_ADDRESS, as on a GPU.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"
#include "server/backend/ptx/relaxed_memory.hpp"

namespace gpuproxy::server::ptx {

const char* spaceName(Space space) {
  switch (space) {
    case Space::kGeneric:
      return "generic";
    case Space::kGlobal:
      return "global";
    case Space::kShared:
      return "shared";
    case Space::kLocal:
      return "local";
    case Space::kConst:
      return "const";
    case Space::kParam:
      return "param";
  }
  return "?";
}

bool raiseFault(ExecContext& context, CUresult status, std::uint64_t address, std::string what) {
  if (context.fault != nullptr && context.fault->status == CUDA_SUCCESS) {
    context.fault->status = status;
    context.fault->address = address;
    context.fault->what = std::move(what);
  }
  return false;
}

namespace {

std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

std::byte* fail(ExecContext& context, CUresult status, Space space, std::uint64_t address,
                unsigned bytes, std::uint32_t lane, bool write, const char* why) {
  std::string what = std::string(write ? "store of " : "load of ") + std::to_string(bytes) +
                     " bytes " + (write ? "to " : "from ") + spaceName(space) + " address " +
                     hex(address) + " by lane " + std::to_string(lane) + ": " + why;
  raiseFault(context, status, address, std::move(what));
  return nullptr;
}

}  // namespace

std::byte* translateSlow(ExecContext& context, Space space, std::uint64_t address, unsigned bytes,
                         unsigned alignment, std::uint32_t lane, bool write) {
  if ((address & (alignment - 1)) != 0) {
    return fail(context, CUDA_ERROR_MISALIGNED_ADDRESS, space, address, bytes, lane, write,
                "misaligned");
  }
  Space resolved = space;
  std::uint64_t offset = address;
  if (space == Space::kGeneric) {
    if (address >= kSharedWindow && address < kSharedWindow + kWindowBytes) {
      resolved = Space::kShared;
      offset = address - kSharedWindow;
    } else if (address >= kLocalWindow && address < kLocalWindow + kWindowBytes) {
      resolved = Space::kLocal;
      offset = address - kLocalWindow;
    } else if (address >= kParamWindow && address < kParamWindow + kWindowBytes) {
      resolved = Space::kParam;
      offset = address - kParamWindow;
      if (offset >= kFrameParamBase) {
        return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                    "outside the kernel's parameters");
      }
    } else {
      resolved = Space::kGlobal;
    }
  }
  switch (resolved) {
    case Space::kShared:
      if (offset < context.sharedBytes && bytes <= context.sharedBytes - offset) {
        return context.shared + offset;
      }
      return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                  "outside the block's shared memory");
    case Space::kLocal:
      if (offset < context.localStride && bytes <= context.localStride - offset) {
        return context.threadLocal(lane) + offset;
      }
      return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                  "outside the thread's local memory");
    case Space::kParam:
      if (offset < kFrameParamBase) {
        if (write) {
          return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                      "kernel parameters are read-only");
        }
        if (offset < context.kernelParamBytes && bytes <= context.kernelParamBytes - offset) {
          return const_cast<std::byte*>(context.kernelParams) + offset;
        }
        return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                    "outside the kernel's parameters");
      }
      offset -= kFrameParamBase;
      if (offset < context.paramStride && bytes <= context.paramStride - offset) {
        return context.params + static_cast<std::size_t>(lane) * context.paramStride + offset;
      }
      return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                  "outside the function's parameters");
    default: {
      const MemoryRange* range =
          context.memory != nullptr ? context.memory->find(address, bytes) : nullptr;
      if (range == nullptr && context.gridWorkspace != nullptr &&
          address >= context.gridWorkspace->begin && address < context.gridWorkspace->end &&
          bytes <= context.gridWorkspace->end - address) {
        range = context.gridWorkspace;
      }
      if (range == nullptr) {
        return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                    "not memory of this client");
      }
      if (write && !range->writable) {
        return fail(context, CUDA_ERROR_ILLEGAL_ADDRESS, space, address, bytes, lane, write,
                    "constant memory is read-only");
      }
      context.lastRange = range;
      return range->host + (address - range->begin);
    }
  }
}

namespace {

// The unsigned integer of `Bytes` bytes.
template <unsigned Bytes>
using Word = std::conditional_t<
    Bytes == 1, std::uint8_t,
    std::conditional_t<Bytes == 2, std::uint16_t,
                       std::conditional_t<Bytes == 4, std::uint32_t, std::uint64_t>>>;

// A loaded word as a register holds it: sign- or zero-extended to 64 bits.
template <unsigned Bytes, bool Signed>
inline std::uint64_t extended(Word<Bytes> value) {
  if constexpr (Signed && Bytes < 8) {
    return bitsOf(static_cast<std::make_signed_t<Word<Bytes>>>(value));
  } else {
    return value;
  }
}

// Each access is a relaxed atomic of its own width (relaxed_memory.hpp says why; translate() has
// checked the alignment).
template <unsigned Bytes, bool Signed>
inline std::uint64_t loadValue(const std::byte* where) {
  return extended<Bytes, Signed>(loadRelaxed<Word<Bytes>>(where));
}

template <unsigned Bytes>
inline void storeValue(std::byte* where, std::uint64_t value) {
  // Little-endian: a narrower store writes the register's low bytes.
  storeRelaxed(where, static_cast<Word<Bytes>>(value));
}

// A vector access (ld.v2, st.v4, ...) is one memory access on a GPU: another thread never sees
// half of an aligned access of up to 16 bytes. CUB's decoupled look-back (Thrust's scans) reads a
// tile's status and value together with one ld.v2/ld.v4 and relies on it. Where other threads
// may race (global memory, shared with every block and with the host; generic addresses, which
// may name it), the whole vector moves in one atomic of its width, 16 bytes at most at a time
// (libatomic's 16-byte access, a single SSE move on processors with AVX). Shared, local and
// parameter memory belong to one block, whose warps take turns by instruction, so they need not.
template <Space S>
inline constexpr bool kMayRace = S == Space::kGlobal || S == Space::kGeneric;

constexpr unsigned kMaxVectorBytes = 32;  // ld.v4.b64

enum class Direction { kLoad, kStore };

// One piece of a vector access: a relaxed atomic of W's width between memory and the buffer.
template <typename W, Direction D>
inline void movePiece(std::byte* memory, std::byte* buffer) {
  std::atomic_ref<W> word(*reinterpret_cast<W*>(memory));
  if constexpr (D == Direction::kLoad) {
    const W value = word.load(std::memory_order_relaxed);
    std::memcpy(buffer, &value, sizeof value);
  } else {
    W value;
    std::memcpy(&value, buffer, sizeof value);
    word.store(value, std::memory_order_relaxed);
  }
}

// Moves a whole vector of `total` bytes between memory and the buffer in single-copy-atomic
// pieces; false when `memory` is not aligned for that (the caller then goes element by element).
template <Direction D>
inline bool moveVectorAtOnce(std::byte* memory, std::byte* buffer, unsigned total) {
  if (reinterpret_cast<std::uintptr_t>(memory) % std::min(total, 16u) != 0) return false;
  switch (total) {
    case 2:
      movePiece<std::uint16_t, D>(memory, buffer);
      return true;
    case 4:
      movePiece<std::uint32_t, D>(memory, buffer);
      return true;
    case 8:
      movePiece<std::uint64_t, D>(memory, buffer);
      return true;
    case 16:
    case 32:
      for (unsigned offset = 0; offset < total; offset += 16) {
        movePiece<unsigned __int128, D>(memory + offset, buffer + offset);
      }
      return true;
    default:
      return false;
  }
}

// ld: op[0..vector-1] destinations, op[4] the address base.
template <unsigned Bytes, bool Signed, Space S>
bool loadHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* base = context.row(instruction.op[4]);
  const unsigned vector = instruction.vector;
  const unsigned total = Bytes * vector;
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::uint64_t address = addressOf(instruction, base, lane);
    const std::byte* where = translate(context, S, address, total, total, lane, false);
    if (where == nullptr) return false;
    if constexpr (kMayRace<S>) {
      alignas(16) std::byte whole[kMaxVectorBytes];
      if (vector > 1 &&
          moveVectorAtOnce<Direction::kLoad>(const_cast<std::byte*>(where), whole, total)) {
        for (unsigned v = 0; v < vector; ++v) {
          Word<Bytes> element;
          std::memcpy(&element, whole + v * Bytes, Bytes);
          context.row(instruction.op[v])[lane] = extended<Bytes, Signed>(element);
        }
        return true;
      }
    }
    for (unsigned v = 0; v < vector; ++v) {
      context.row(instruction.op[v])[lane] = loadValue<Bytes, Signed>(where + v * Bytes);
    }
    return true;
  });
}

// st: op[0..vector-1] sources, op[4] the address base.
template <unsigned Bytes, Space S>
bool storeHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* base = context.row(instruction.op[4]);
  const unsigned vector = instruction.vector;
  const unsigned total = Bytes * vector;
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::uint64_t address = addressOf(instruction, base, lane);
    std::byte* where = translate(context, S, address, total, total, lane, true);
    if (where == nullptr) return false;
    if constexpr (kMayRace<S>) {
      if (vector > 1) {
        alignas(16) std::byte whole[kMaxVectorBytes];
        for (unsigned v = 0; v < vector; ++v) {
          // Little-endian: an element is the low bytes of its register.
          const auto element = static_cast<Word<Bytes>>(context.row(instruction.op[v])[lane]);
          std::memcpy(whole + v * Bytes, &element, Bytes);
        }
        if (moveVectorAtOnce<Direction::kStore>(where, whole, total)) return true;
      }
    }
    for (unsigned v = 0; v < vector; ++v) {
      storeValue<Bytes>(where + v * Bytes, context.row(instruction.op[v])[lane]);
    }
    return true;
  });
}

// ld.param of a kernel parameter by name: the same value for every lane.
template <unsigned Bytes, bool Signed>
bool loadKernelParamHandler(ExecContext& context, const Instruction& instruction,
                            std::uint32_t mask) {
  const std::uint64_t offset = static_cast<std::uint64_t>(instruction.immediate);
  const unsigned vector = instruction.vector;
  if (offset > context.kernelParamBytes || Bytes * vector > context.kernelParamBytes - offset) {
    return raiseFault(context, CUDA_ERROR_ILLEGAL_ADDRESS, offset,
                      "load outside the kernel's parameters");
  }
  for (unsigned v = 0; v < vector; ++v) {
    // The parameter buffer is this launch's own and may pack a value at any offset: no atomics.
    Word<Bytes> word;
    std::memcpy(&word, context.kernelParams + offset + v * Bytes, Bytes);
    const std::uint64_t value = extended<Bytes, Signed>(word);
    std::uint64_t* d = context.row(instruction.op[v]);
    forLanes(mask, [&](std::uint32_t lane) { d[lane] = value; });
  }
  return true;
}

template <unsigned Bytes, bool Signed>
Handler loadFor(Space space) {
  switch (space) {
    case Space::kGlobal:
      return &loadHandler<Bytes, Signed, Space::kGlobal>;
    case Space::kShared:
      return &loadHandler<Bytes, Signed, Space::kShared>;
    case Space::kLocal:
      return &loadHandler<Bytes, Signed, Space::kLocal>;
    case Space::kConst:
      return &loadHandler<Bytes, Signed, Space::kConst>;
    case Space::kParam:
      return &loadHandler<Bytes, Signed, Space::kParam>;
    default:
      return &loadHandler<Bytes, Signed, Space::kGeneric>;
  }
}

template <unsigned Bytes>
Handler storeFor(Space space) {
  switch (space) {
    case Space::kGlobal:
      return &storeHandler<Bytes, Space::kGlobal>;
    case Space::kShared:
      return &storeHandler<Bytes, Space::kShared>;
    case Space::kLocal:
      return &storeHandler<Bytes, Space::kLocal>;
    case Space::kConst:
      return &storeHandler<Bytes, Space::kConst>;
    case Space::kParam:
      return &storeHandler<Bytes, Space::kParam>;
    default:
      return &storeHandler<Bytes, Space::kGeneric>;
  }
}

// ---- Atomics ----------------------------------------------------------------------------------

enum class AtomicOp : std::uint8_t { kAdd, kMin, kMax, kInc, kDec, kAnd, kOr, kXor, kExch, kCas };

template <typename T>
T combine(AtomicOp op, T old, T operand) {
  switch (op) {
    case AtomicOp::kAdd:
      if constexpr (std::is_floating_point_v<T>) {
        return old + operand;
      } else {
        return static_cast<T>(static_cast<std::make_unsigned_t<T>>(old) +
                              static_cast<std::make_unsigned_t<T>>(operand));
      }
    case AtomicOp::kMin:
      return operand < old ? operand : old;
    case AtomicOp::kMax:
      return operand > old ? operand : old;
    case AtomicOp::kExch:
      return operand;
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case AtomicOp::kInc:
        return old >= operand ? T(0) : static_cast<T>(old + 1);
      case AtomicOp::kDec:
        return (old == 0 || old > operand) ? operand : static_cast<T>(old - 1);
      case AtomicOp::kAnd:
        return old & operand;
      case AtomicOp::kOr:
        return old | operand;
      case AtomicOp::kXor:
        return old ^ operand;
      default:
        break;
    }
  }
  return operand;
}

// Packed half-precision add (atom.add.noftz.f16x2 and friends), on the 32-bit word.
template <bool Bf16, bool Packed>
std::uint32_t addHalves(std::uint32_t old, std::uint32_t operand) {
  std::uint32_t out = old;
  for (unsigned part = 0; part < (Packed ? 2u : 1u); ++part) {
    const unsigned shift = 16 * part;
    const auto x = static_cast<std::uint16_t>(old >> shift);
    const auto y = static_cast<std::uint16_t>(operand >> shift);
    const double sum = Bf16 ? fromBfloat16(x) + fromBfloat16(y) : fromHalf(x) + fromHalf(y);
    const std::uint16_t bits = Bf16 ? toBfloat16(sum) : toHalf(sum);
    out = (out & ~(0xffffu << shift)) | (std::uint32_t{bits} << shift);
  }
  return out;
}

// atom/red: op[0] the old value's destination (none for red), op[1] the operand, op[2] the
// compare value of cas (its new value is op[1]... see binder), op[4] the address base.
// `extra` holds the AtomicOp; flags bit 0 the 32-bit address base.
template <typename T, Space S, int Kind>  // Kind 0 plain, 1 f16 add, 2 f16x2 add, 3 bf16, 4 bf16x2
bool atomicHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  using Bits = std::conditional_t<sizeof(T) == 8, std::uint64_t,
                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>>;
  const std::uint64_t* base = context.row(instruction.op[4]);
  const std::uint64_t* operandRow = context.row(instruction.op[1]);
  const std::uint64_t* compareRow =
      instruction.op[2] != kNoRegister ? context.row(instruction.op[2]) : nullptr;
  std::uint64_t* destination =
      instruction.op[0] != kNoRegister ? context.row(instruction.op[0]) : nullptr;
  const auto op = static_cast<AtomicOp>(instruction.extra);
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::uint64_t address = addressOf(instruction, base, lane);
    std::byte* where = translate(context, S, address, sizeof(T), sizeof(T), lane, true);
    if (where == nullptr) return false;
    std::atomic_ref<Bits> word(*reinterpret_cast<Bits*>(where));
    const auto operand = static_cast<Bits>(operandRow[lane]);
    Bits old = word.load(std::memory_order_relaxed);
    if (op == AtomicOp::kCas) {
      // cas: compare with op[2]'s value (b), store op[1]'s value (c) if equal.
      Bits expected = static_cast<Bits>(compareRow[lane]);
      word.compare_exchange_strong(expected, operand, std::memory_order_seq_cst);
      old = expected;
    } else if (op == AtomicOp::kExch) {
      old = word.exchange(operand, std::memory_order_seq_cst);
    } else {
      for (;;) {
        Bits next = 0;
        if constexpr (Kind == 1) {
          next = static_cast<Bits>(addHalves<false, false>(old, operand));
        } else if constexpr (Kind == 2) {
          next = static_cast<Bits>(addHalves<false, true>(old, operand));
        } else if constexpr (Kind == 3) {
          next = static_cast<Bits>(addHalves<true, false>(old, operand));
        } else if constexpr (Kind == 4) {
          next = static_cast<Bits>(addHalves<true, true>(old, operand));
        } else {
          next = static_cast<Bits>(bitsOf(combine<T>(op, as<T>(old), as<T>(operand))));
        }
        if (word.compare_exchange_weak(old, next, std::memory_order_seq_cst)) break;
      }
    }
    if (destination != nullptr) {
      if constexpr (Kind == 0) {
        destination[lane] = bitsOf(as<T>(old));
      } else {
        destination[lane] = old;
      }
    }
    return true;
  });
}

template <typename T, int Kind>
Handler atomicFor(Space space) {
  switch (space) {
    case Space::kGlobal:
      return &atomicHandler<T, Space::kGlobal, Kind>;
    case Space::kShared:
      return &atomicHandler<T, Space::kShared, Kind>;
    default:
      return &atomicHandler<T, Space::kGeneric, Kind>;
  }
}

// cvta: to the generic space (`to` false) or from it; flags bit 1: the 32-bit form.
template <Space S, bool To>
bool cvtaHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  const std::uint64_t* a = context.row(instruction.op[1]);
  const bool narrow = (instruction.flags & 2) != 0;
  std::uint64_t window = 0;
  if (S == Space::kShared) window = kSharedWindow;
  if (S == Space::kLocal) window = kLocalWindow;
  if (S == Space::kParam) window = kParamWindow;
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint64_t value = narrow ? static_cast<std::uint32_t>(a[lane]) : a[lane];
    // No special case for 0: offset 0 of a state space is a valid address (its first variable).
    const std::uint64_t out = To ? value - window : value + window;
    d[lane] = narrow ? static_cast<std::uint32_t>(out) : out;
  });
  return true;
}

template <Space S>
bool isspacepHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* a = context.row(instruction.op[1]);
  std::uint32_t result = 0;
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint64_t value = a[lane];
    const bool shared = value >= kSharedWindow && value < kSharedWindow + kWindowBytes;
    const bool local = value >= kLocalWindow && value < kLocalWindow + kWindowBytes;
    const bool param = value >= kParamWindow && value < kParamWindow + kWindowBytes;
    bool inside = false;
    if (S == Space::kShared) inside = shared;
    if (S == Space::kLocal) inside = local;
    if (S == Space::kParam) inside = param;
    if (S == Space::kGlobal) inside = !shared && !local && !param;
    if (S == Space::kConst) {
      const MemoryRange* range =
          context.memory != nullptr ? context.memory->find(value, 1) : nullptr;
      inside = range != nullptr && !range->writable;
    }
    result |= static_cast<std::uint32_t>(inside) << lane;
  });
  std::uint32_t& p = context.preds[instruction.op[0]];
  p = (p & ~mask) | (result & mask);
  return true;
}

bool fenceHandler(ExecContext&, const Instruction&, std::uint32_t) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return true;
}

// createpolicy writes a cache policy that only cache hints read: any value will do.
bool createPolicyHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  std::uint64_t* d = context.row(instruction.op[0]);
  forLanes(mask, [&](std::uint32_t lane) { d[lane] = 0; });
  return true;
}

// cp.async: a copy from global to shared memory that the thread waits for later
// (cp.async.wait_group/wait_all). The sim copies at once, which is one of the orders the program
// must already allow: the shared memory is the copy's from issue until the wait, and the source
// is not read again. op[4]/immediate the shared destination, op[5]/extra the global source,
// width the copy's size; op[1] what to read of the source (bytes, or a predicate "ignore it"),
// the rest is zero-filled.
constexpr std::uint8_t kSourceBase32 = 2;

enum class CopySource { kWhole, kBytes, kIgnoredWhen };

template <CopySource Source>
bool copyAsyncHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const std::uint64_t* destinationBase = context.row(instruction.op[4]);
  const std::uint64_t* sourceBase = context.row(instruction.op[5]);
  const unsigned bytes = instruction.width;
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::uint64_t destination = addressOf(instruction, destinationBase, lane);
    std::uint64_t source = sourceBase[lane];
    if ((instruction.flags & kSourceBase32) != 0) source = static_cast<std::uint32_t>(source);
    source += static_cast<std::uint64_t>(static_cast<std::int32_t>(instruction.extra));
    unsigned sourceBytes = bytes;
    if constexpr (Source == CopySource::kBytes) {
      sourceBytes = static_cast<unsigned>(
          std::min<std::uint64_t>(context.row(instruction.op[1])[lane] & 0xffffffffu, bytes));
    } else if constexpr (Source == CopySource::kIgnoredWhen) {
      if ((context.preds[instruction.op[1]] >> lane) & 1u) sourceBytes = 0;
    }
    std::byte* to = translate(context, Space::kShared, destination, bytes, bytes, lane, true);
    if (to == nullptr) return false;
    alignas(16) std::byte copied[16] = {};
    if (sourceBytes > 0) {
      std::byte* from = translate(context, Space::kGlobal, source, sourceBytes, bytes, lane, false);
      if (from == nullptr) return false;
      if (sourceBytes < bytes || !moveVectorAtOnce<Direction::kLoad>(from, copied, bytes)) {
        for (unsigned i = 0; i < sourceBytes; ++i) {
          movePiece<std::uint8_t, Direction::kLoad>(from + i, copied + i);
        }
      }
    }
    std::memcpy(to, copied, bytes);  // the block's own shared memory: no other thread races
    return true;
  });
}

// cp.async.{ca,cg}.shared{::cta}.global [dst], [src], cp-size{, src-size | ignore-src}{, policy}
// and its group operations. (cp.async.mbarrier.arrive is ptx_ops_barrier.cpp's; cp.async.bulk is
// refused by name, with the rest of TMA.)
bool bindCopyAsync(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                   OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const std::vector<Operand>& operands = parsed.operands;
  if (!qualifiers.take("async")) {
    return unsupportedBinding(resolver, unsupported,
                              "an instruction the interpreter does not know");
  }
  if (qualifiers.take("commit_group") || qualifiers.take("wait_all")) {
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    instruction.handler = &nopHandler;  // every copy is done when it is issued
    return true;
  }
  if (qualifiers.take("wait_group")) {
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 1, resolver)) return false;
    instruction.handler = &nopHandler;
    return true;
  }
  const bool cacheHint = qualifiers.take("L2::cache_hint");
  qualifiers.takeAny({"ca", "cg"});
  qualifiers.takeAny({"L2::64B", "L2::128B", "L2::256B"});
  if (!(qualifiers.take("shared") || qualifiers.take("shared::cta")) ||
      !qualifiers.take("global")) {
    return bindError(resolver, "cp.async copies from .global to .shared");
  }
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  const std::size_t count = operands.size() - (cacheHint ? 1 : 0);
  if (operands.size() < 3 || count < 3 || count > 4) {
    return bindError(resolver, "cp.async takes [dst], [src], cp-size and an optional src-size");
  }
  if (operands[2].kind != Operand::Kind::kInteger ||
      (operands[2].integer != 4 && operands[2].integer != 8 && operands[2].integer != 16)) {
    return bindError(resolver, "cp.async copies 4, 8 or 16 bytes");
  }
  instruction.width = static_cast<std::uint8_t>(operands[2].integer);
  instruction.flow = Flow::kMemory;
  instruction.space = static_cast<std::uint8_t>(Space::kShared);
  if (!bindAddress(instruction, operands[0], Space::kShared, resolver)) return false;
  const std::optional<OperandResolver::Address> source =
      resolver.address(operands[1], Space::kGlobal);
  if (!source) return false;
  if (source->offset < INT32_MIN || source->offset > INT32_MAX) {
    return bindError(resolver, "cp.async source offset out of range");
  }
  instruction.op[5] = source->row;
  instruction.extra = static_cast<std::uint32_t>(static_cast<std::int32_t>(source->offset));
  if (source->base32) instruction.flags |= kSourceBase32;
  if (count == 3) {
    instruction.handler = &copyAsyncHandler<CopySource::kWhole>;
    return true;
  }
  // The fourth operand: src-size (an integer) or ignore-src (a predicate).
  const Operand& what = operands[3];
  if (what.kind == Operand::Kind::kRegister && resolver.predicate(what) != kNoPredicate) {
    if (what.negated) return bindError(resolver, "cp.async's ignore-src cannot be negated");
    if (!bindPredicate(instruction, 1, what, resolver)) return false;
    instruction.handler = &copyAsyncHandler<CopySource::kIgnoredWhen>;
    return true;
  }
  resolver.error().clear();  // not a predicate: a byte count
  if (!bindSource(instruction, 1, what, Type::kU32, resolver)) return false;
  instruction.handler = &copyAsyncHandler<CopySource::kBytes>;
  return true;
}

}  // namespace

bool bindAddress(Instruction& instruction, const Operand& operand, Space space,
                 OperandResolver& resolver) {
  const std::optional<OperandResolver::Address> address = resolver.address(operand, space);
  if (!address) return false;
  instruction.op[4] = address->row;
  instruction.immediate = address->offset;
  if (address->base32) instruction.flags |= kAddressBase32;
  return true;
}

bool bindMemory(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  const std::vector<Operand>& operands = parsed.operands;
  if (base == "membar" || base == "fence") {
    qualifiers.takeAny({"cta", "gl", "sys", "gpu", "cluster"});
    qualifiers.takeAny({"sc", "acq_rel", "acquire", "release"});
    const bool proxy = qualifiers.take("proxy") || qualifiers.take("proxy::async");
    if (proxy) {
      qualifiers.takeAny({"alias", "async", "async::global", "async::shared::cta", "generic",
                          "tensormap::generic"});
    }
    qualifiers.take("op_restrict");
    qualifiers.take("sync_restrict::shared::cta");
    qualifiers.take("sync_restrict::shared::cluster");
    qualifiers.take("mbarrier_init");
    qualifiers.take("release");
    qualifiers.take("cluster");
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    // fence.proxy.tensormap and friends carry operands; they order nothing the sim can get wrong.
    instruction.handler = &fenceHandler;
    return true;
  }
  if (base == "prefetch" || base == "prefetchu" || base == "applypriority" || base == "discard") {
    instruction.handler = &nopHandler;
    return true;  // hints: nothing to check, nothing to do
  }
  if (base == "createpolicy") {
    if (operands.empty()) return bindError(resolver, "createpolicy without a destination");
    if (!bindDestination(instruction, 0, operands[0], Type::kB64, resolver)) return false;
    instruction.handler = &createPolicyHandler;
    return true;
  }
  if (base == "cvta" || base == "isspacep") {
    const bool to = qualifiers.take("to");
    const Space space = qualifiers.takeSpace();
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (base == "isspacep") {
      if (!bindPredicate(instruction, 0, operands[0], resolver) ||
          !bindSource(instruction, 1, operands[1], Type::kU64, resolver)) {
        return false;
      }
      switch (space) {
        case Space::kGlobal:
          instruction.handler = &isspacepHandler<Space::kGlobal>;
          break;
        case Space::kShared:
          instruction.handler = &isspacepHandler<Space::kShared>;
          break;
        case Space::kLocal:
          instruction.handler = &isspacepHandler<Space::kLocal>;
          break;
        case Space::kConst:
          instruction.handler = &isspacepHandler<Space::kConst>;
          break;
        case Space::kParam:
          instruction.handler = &isspacepHandler<Space::kParam>;
          break;
        default:
          return bindError(resolver, "isspacep needs a space");
      }
      return true;
    }
    if (types.size() != 1 || (types[0] != Type::kU32 && types[0] != Type::kU64)) {
      return bindError(resolver, "cvta needs .u32 or .u64");
    }
    if (types[0] == Type::kU32) instruction.flags |= 2;
    if (!bindDestination(instruction, 0, operands[0], types[0], resolver) ||
        !bindSource(instruction, 1, operands[1], types[0], resolver)) {
      return false;
    }
    switch (space) {
      case Space::kGlobal:
      case Space::kConst:
        instruction.handler =
            to ? &cvtaHandler<Space::kGlobal, true> : &cvtaHandler<Space::kGlobal, false>;
        break;
      case Space::kShared:
        instruction.handler =
            to ? &cvtaHandler<Space::kShared, true> : &cvtaHandler<Space::kShared, false>;
        break;
      case Space::kLocal:
        instruction.handler =
            to ? &cvtaHandler<Space::kLocal, true> : &cvtaHandler<Space::kLocal, false>;
        break;
      case Space::kParam:
        instruction.handler =
            to ? &cvtaHandler<Space::kParam, true> : &cvtaHandler<Space::kParam, false>;
        break;
      default:
        return bindError(resolver, "cvta needs a space");
    }
    return true;
  }

  if (base == "cp") {
    if (parsed.opcode.starts_with("cp.async.mbarrier.")) {
      return bindAsyncBarrier(parsed, qualifiers, resolver, instruction, unsupported);
    }
    return bindCopyAsync(parsed, qualifiers, resolver, instruction, unsupported);
  }

  qualifiers.takeOrderingAndHints();
  const Space space = qualifiers.takeSpace();
  instruction.space = static_cast<std::uint8_t>(space);
  instruction.flow = Flow::kMemory;

  if (base == "ld" || base == "ldu" || base == "st") {
    const bool load = base != "st";
    const unsigned vector = qualifiers.takeVector();
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (types.size() != 1) return bindError(resolver, "expected one type");
    const Type type = types[0];
    const unsigned bytes = typeBytes(type);
    if (type == Type::kPred) return bindError(resolver, "ld/st of a predicate");
    if (bytes == 16 || vector > 4)
      return unsupportedBinding(resolver, unsupported, "128-bit or .v8 access");
    // A cache-policy operand (.L2::cache_hint) may follow.
    if (operands.size() != 2 && operands.size() != 3)
      return bindError(resolver, "expected 2 operands");
    instruction.vector = static_cast<std::uint8_t>(vector);
    instruction.width = static_cast<std::uint8_t>(bytes);
    const Operand& value = load ? operands[0] : operands[1];
    const Operand& address = load ? operands[1] : operands[0];
    // The value: a register, or a vector {a, b, ...} of them (`_` discards a loaded element).
    std::vector<Operand> elements;
    if (value.kind == Operand::Kind::kVector && !value.parenthesized) {
      elements = value.elements;
    } else {
      elements.push_back(value);
    }
    if (elements.size() != vector) return bindError(resolver, "vector size does not match");
    for (unsigned v = 0; v < vector; ++v) {
      if (load) {
        if (!bindDestination(instruction, static_cast<int>(v), elements[v], type, resolver))
          return false;
        // A narrow load into a wide register: signed types sign-extend to the register.
      } else {
        if (!bindSource(instruction, static_cast<int>(v), elements[v], type, resolver))
          return false;
      }
    }
    const bool isSignedLoad = isSigned(type);
    // ld.param of a kernel parameter by name: the same for every lane, read straight from the
    // launch's parameter buffer.
    const std::optional<OperandResolver::Address> resolved = resolver.address(address, space);
    if (!resolved) return false;
    instruction.op[4] = resolved->row;
    instruction.immediate = resolved->offset;
    if (resolved->base32) instruction.flags |= kAddressBase32;
    if (load && space == Space::kParam && resolved->isConstant &&
        resolved->constantValue < kFrameParamBase) {
      instruction.immediate = static_cast<std::int64_t>(resolved->constantValue) + resolved->offset;
      instruction.op[4] = kNoRegister;
      switch (bytes) {
        case 1:
          instruction.handler =
              isSignedLoad ? &loadKernelParamHandler<1, true> : &loadKernelParamHandler<1, false>;
          break;
        case 2:
          instruction.handler =
              isSignedLoad ? &loadKernelParamHandler<2, true> : &loadKernelParamHandler<2, false>;
          break;
        case 4:
          instruction.handler =
              isSignedLoad ? &loadKernelParamHandler<4, true> : &loadKernelParamHandler<4, false>;
          break;
        default:
          instruction.handler = &loadKernelParamHandler<8, false>;
          break;
      }
      return true;
    }
    Handler handler = nullptr;
    if (load) {
      switch (bytes) {
        case 1:
          handler = isSignedLoad ? loadFor<1, true>(space) : loadFor<1, false>(space);
          break;
        case 2:
          handler = isSignedLoad ? loadFor<2, true>(space) : loadFor<2, false>(space);
          break;
        case 4:
          handler = isSignedLoad ? loadFor<4, true>(space) : loadFor<4, false>(space);
          break;
        case 8:
          handler = loadFor<8, false>(space);
          break;
        default:
          break;
      }
    } else {
      switch (bytes) {
        case 1:
          handler = storeFor<1>(space);
          break;
        case 2:
          handler = storeFor<2>(space);
          break;
        case 4:
          handler = storeFor<4>(space);
          break;
        case 8:
          handler = storeFor<8>(space);
          break;
        default:
          break;
      }
    }
    if (handler == nullptr) return bindError(resolver, "access size");
    instruction.handler = handler;
    return true;
  }

  if (base == "atom" || base == "red") {
    const bool reduction = base == "red";
    const std::string_view opName =
        qualifiers.takeAny({"add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas"});
    qualifiers.take("noftz");
    const unsigned vector = qualifiers.takeVector();
    const std::vector<Type> types = qualifiers.takeTypes();
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (opName.empty()) return bindError(resolver, "atom without an operation");
    if (vector != 1) return unsupportedBinding(resolver, unsupported, "vector atomics");
    if (types.size() != 1) return bindError(resolver, "expected one type");
    const Type type = types[0];
    if (space != Space::kGlobal && space != Space::kShared && space != Space::kGeneric) {
      return bindError(resolver, "atomics need global, shared or generic memory");
    }
    const bool cas = opName == "cas";
    const std::size_t expected = (reduction ? 2 : 3) + (cas ? 1 : 0);
    // A cache-policy operand (.L2::cache_hint) may follow.
    if (operands.size() != expected && operands.size() != expected + 1) {
      return bindError(resolver, "expected " + std::to_string(expected) + " operands");
    }
    std::size_t next = 0;
    if (!reduction) {
      if (!bindDestination(instruction, 0, operands[next++], type, resolver)) return false;
    }
    if (!bindAddress(instruction, operands[next++], space, resolver)) return false;
    if (cas) {
      // atom.cas d, [a], b, c: compare with b, store c.
      if (!bindSource(instruction, 2, operands[next++], type, resolver)) return false;
    }
    if (!bindSource(instruction, 1, operands[next++], type, resolver)) return false;
    AtomicOp op = AtomicOp::kAdd;
    if (opName == "min") op = AtomicOp::kMin;
    if (opName == "max") op = AtomicOp::kMax;
    if (opName == "inc") op = AtomicOp::kInc;
    if (opName == "dec") op = AtomicOp::kDec;
    if (opName == "and") op = AtomicOp::kAnd;
    if (opName == "or") op = AtomicOp::kOr;
    if (opName == "xor") op = AtomicOp::kXor;
    if (opName == "exch") op = AtomicOp::kExch;
    if (opName == "cas") op = AtomicOp::kCas;
    instruction.extra = static_cast<std::uint32_t>(op);
    Handler handler = nullptr;
    const bool bitwise = op == AtomicOp::kAnd || op == AtomicOp::kOr || op == AtomicOp::kXor ||
                         op == AtomicOp::kExch || op == AtomicOp::kCas;
    switch (type) {
      case Type::kU32:
      case Type::kB32:
        if (!bitwise && type == Type::kB32) break;
        handler = atomicFor<std::uint32_t, 0>(space);
        break;
      case Type::kS32:
        if (bitwise && op != AtomicOp::kExch && op != AtomicOp::kCas) break;
        handler = atomicFor<std::int32_t, 0>(space);
        break;
      case Type::kU64:
      case Type::kB64:
        if (op == AtomicOp::kInc || op == AtomicOp::kDec) break;
        handler = atomicFor<std::uint64_t, 0>(space);
        break;
      case Type::kS64:
        if (op != AtomicOp::kMin && op != AtomicOp::kMax && op != AtomicOp::kAdd) break;
        handler = atomicFor<std::int64_t, 0>(space);
        break;
      case Type::kF32:
        if (op == AtomicOp::kAdd || op == AtomicOp::kExch) handler = atomicFor<float, 0>(space);
        if (op == AtomicOp::kMin || op == AtomicOp::kMax) {
          return unsupportedBinding(resolver, unsupported, "atomic float min/max");
        }
        break;
      case Type::kF64:
        if (op == AtomicOp::kAdd) handler = atomicFor<double, 0>(space);
        break;
      case Type::kB16:
        if (op == AtomicOp::kCas || op == AtomicOp::kExch)
          handler = atomicFor<std::uint16_t, 0>(space);
        break;
      case Type::kF16:
        if (op == AtomicOp::kAdd) handler = atomicFor<std::uint16_t, 1>(space);
        break;
      case Type::kF16x2:
        if (op == AtomicOp::kAdd) handler = atomicFor<std::uint32_t, 2>(space);
        break;
      case Type::kBf16:
        if (op == AtomicOp::kAdd) handler = atomicFor<std::uint16_t, 3>(space);
        break;
      case Type::kBf16x2:
        if (op == AtomicOp::kAdd) handler = atomicFor<std::uint32_t, 4>(space);
        break;
      default:
        break;
    }
    if (handler == nullptr) return unsupportedBinding(resolver, unsupported, "this atomic type");
    instruction.width = static_cast<std::uint8_t>(typeBytes(type));
    instruction.handler = handler;
    return true;
  }
  return unsupportedBinding(resolver, unsupported, "this memory instruction");
}

}  // namespace gpuproxy::server::ptx
