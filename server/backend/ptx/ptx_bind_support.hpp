#pragma once
// Shared by the instruction families' binders (ptx_ops_*.cpp): an opcode split into its base and
// its qualifiers, and the small checks every binder makes.

#include <string>
#include <string_view>
#include <vector>

#include "server/backend/ptx/ptx_numeric.hpp"
#include "server/backend/ptx/ptx_syntax.hpp"

namespace gpuproxy::server::ptx {

// "ld.global.nc.v2.f32" -> base "ld", qualifiers {global, nc, v2, f32}, types {f32}.
class Qualifiers {
public:
  explicit Qualifiers(std::string_view opcode);

  std::string_view base() const { return base_; }
  // Whether `word` (without its dot) was written; marks it as understood.
  bool take(std::string_view word);
  // The first of `words` that was written (marked as understood), or empty.
  std::string_view takeAny(std::initializer_list<std::string_view> words);
  // Types in the order written (marked as understood).
  std::vector<Type> takeTypes();
  // A state space qualifier (global, shared[::cta], local, const, param), or kGeneric.
  Space takeSpace();
  // .rn/.rz/.rm/.rp (or the integer forms .rni/... when `integral`).
  Rounding takeRounding(bool& integral);
  // .v2/.v4 -> 2/4, else 1.
  unsigned takeVector();
  // Drops the memory-ordering, scope, cache and eviction qualifiers that change nothing on the
  // sim (every access is coherent and immediately visible).
  void takeOrderingAndHints();
  // The first qualifier not taken, or empty when every one was understood.
  std::string_view leftover() const;

private:
  std::string_view base_;
  std::vector<std::string_view> words_;
  std::vector<bool> taken_;
};

// Fails the binding with a message.
inline bool bindError(OperandResolver& resolver, std::string message) {
  if (resolver.error().empty()) resolver.error() = std::move(message);
  return false;
}

inline bool unsupportedBinding(OperandResolver& resolver, bool& unsupported, std::string message) {
  unsupported = true;
  resolver.error() = std::move(message);
  return false;
}

// The family of instructions `opcode` belongs to when the sim has none of it (surface
// reductions, some tensor cores, cp.async, TMA, mbarrier, clusters, multimem), else empty.
std::string_view unsupportedFamily(std::string_view opcode);
// %clusterid, %cluster_ctarank and the other special registers of thread-block clusters.
bool isClusterRegister(std::string_view name);

// Checks that nothing is left over and the operand count is right.
bool finishQualifiers(const Qualifiers& qualifiers, OperandResolver& resolver, bool& unsupported);
bool expectOperands(const ParsedInstruction& parsed, std::size_t count, OperandResolver& resolver);

// Sets op[index] to a source row; false on error.
bool bindSource(Instruction& instruction, int index, const Operand& operand, Type type,
                OperandResolver& resolver);
bool bindDestination(Instruction& instruction, int index, const Operand& operand, Type type,
                     OperandResolver& resolver);
bool bindPredicate(Instruction& instruction, int index, const Operand& operand,
                   OperandResolver& resolver);
// `count` registers, written `{a, b, ...}` or (one) alone, as rows read or written as `type`,
// appended to `rows`; false on error.
bool bindRegisterList(const Operand& operand, std::size_t count, Type type, bool written,
                      OperandResolver& resolver, std::vector<std::uint32_t>& rows);
// A memory operand [base + offset] into op[4] and `immediate` (kAddressBase32 when the base is a
// 32-bit register); false on error.
bool bindAddress(Instruction& instruction, const Operand& operand, Space space,
                 OperandResolver& resolver);

// The instruction families. Each returns false with resolver.error() set (and `unsupported` for
// valid PTX the interpreter does not execute).
bool bindInteger(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported);
bool bindFloat(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
               Instruction& instruction, bool& unsupported);
bool bindHalf(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported);
bool bindConvert(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported);
bool bindMemory(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                Instruction& instruction, bool& unsupported);
bool bindWarp(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported);
bool bindMove(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported);
bool bindControl(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported);
// mbarrier and cp.async.mbarrier.arrive (ptx_ops_barrier.cpp).
bool bindAsyncBarrier(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                      OperandResolver& resolver, Instruction& instruction, bool& unsupported);
// vadd2/4, vabsdiff2/4, vset2/4 and the other SIMD video instructions (ptx_ops_video.cpp).
bool bindVideo(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
               Instruction& instruction, bool& unsupported);
// tex, tld4, txq, suld, sust and suq (ptx_ops_texture.cpp).
bool bindTexture(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported);
// wmma, mma, ldmatrix, stmatrix and movmatrix (ptx_ops_matrix.cpp).
bool bindMatrix(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                Instruction& instruction, bool& unsupported);

// setp/set: the optional .and/.or/.xor and its predicate, the parsed operand at `combineIndex`
// (op[3]; flags bits 0-2 as compareHandler reads them).
// `combine` is the qualifier, taken before the others were checked (Qualifiers::takeAny).
bool bindCombine(const ParsedInstruction& parsed, std::string_view combine,
                 OperandResolver& resolver, Instruction& instruction, std::size_t combineIndex);

// Whether the family handles this base opcode.
bool isIntegerOpcode(std::string_view base);
bool isFloatOpcode(std::string_view base);  // depends on the type: see bindInstruction
bool isMemoryOpcode(std::string_view base);
bool isWarpOpcode(std::string_view base);
bool isControlOpcode(std::string_view base);
bool isVideoOpcode(std::string_view base);
bool isTextureOpcode(std::string_view base);

}  // namespace gpuproxy::server::ptx
