#pragma once
// The front end's view of one instruction between reading it and binding it to a handler:
// operands as written, and the resolver that turns names into frame rows and predicates.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/backend/ptx/ptx_program.hpp"

namespace gpuproxy::server::ptx {

// PTX fundamental types (and the predicate type).
enum class Type : std::uint8_t {
  kNone,
  kB8,
  kB16,
  kB32,
  kB64,
  kB128,
  kU8,
  kU16,
  kU32,
  kU64,
  kS8,
  kS16,
  kS32,
  kS64,
  kF16,
  kF16x2,
  kBf16,
  kBf16x2,
  kTf32,
  kF32,
  kF64,
  kPred
};

Type parseType(std::string_view word);  // ".u32" -> kU32; kNone when not a type
unsigned typeBytes(Type type);
bool isSigned(Type type);
bool isFloat(Type type);    // f16 .. f64 (not the packed ones)
bool isInteger(Type type);  // b, u, s

struct Operand {
  enum class Kind : std::uint8_t {
    kRegister,  // %r1 (name)
    kInteger,   // 42, -1, 0x10
    kFloat,     // 0f3F800000 (bits, f32), 0d... (f64), 1.5 (a double)
    kSymbol,    // a variable, function or label, plus an offset
    kAddress,   // [base + offset]: base is a register, a symbol or nothing; [base, {a, b}]
                // (a texture's coordinates) keeps the tuple in elements
    kVector,    // {a, b, ...}
    kSink       // _
  };
  Kind kind = Kind::kRegister;
  std::string name;               // register or symbol (kAddress: the base; empty for [number])
  bool baseIsRegister = false;    // kAddress
  bool negated = false;           // !%p
  bool parenthesized = false;     // kVector written (a, b): a call's argument or result list
  bool hexFloatSingle = false;    // kFloat written 0f...
  bool hexFloatDouble = false;    // kFloat written 0d...
  std::int64_t integer = 0;       // kInteger value; kSymbol/kAddress offset
  std::uint64_t floatBits = 0;    // kFloat: the bits as written (f32 bits for 0f, f64 otherwise)
  std::vector<Operand> elements;  // kVector
  // shfl/setp write a second predicate: d|p.
  std::optional<std::string> pairedPredicate;
};

struct ParsedInstruction {
  std::string opcode;  // the whole dotted name: "ld.global.v2.f32"
  std::vector<Operand> operands;
  std::string guard;  // predicate name, empty when unguarded
  bool guardNegated = false;
  std::uint32_t line = 0;
};

// Resolves names for the binder. Every method returns kNoRegister / kNoPredicate (and sets
// error()) when the operand cannot be used that way.
class OperandResolver {
public:
  virtual ~OperandResolver() = default;
  // A register (or an immediate or symbol address as a constant row) read as `type`.
  virtual std::uint32_t source(const Operand& operand, Type type) = 0;
  // A register written by the instruction.
  virtual std::uint32_t destination(const Operand& operand, Type type) = 0;
  // The width in bytes of a register row (0 for constants).
  virtual unsigned registerBytes(std::uint32_t row) const = 0;
  virtual std::uint32_t predicate(const Operand& operand) = 0;
  // A constant row holding `bits`.
  virtual std::uint32_t constant(std::uint64_t bits) = 0;
  // An address operand: a row holding its base (a register or a symbol's address) plus an
  // offset. `space` is the instruction's state space; a symbol may refine it (a .shared variable
  // in a generic access is still a generic address).
  struct Address {
    std::uint32_t row = kNoRegister;
    std::int64_t offset = 0;
    bool base32 = false;      // the base register is 32 bits wide
    bool isConstant = false;  // the base is a constant row of a known value (a symbol)
    std::uint64_t constantValue = 0;
  };
  virtual std::optional<Address> address(const Operand& operand, Space space) = 0;
  // A branch target label; the instruction index is patched when the label is defined.
  virtual std::optional<std::uint32_t> label(const Operand& operand) = 0;
  // A function by name, or nullopt.
  virtual std::optional<std::uint32_t> function(std::string_view name) = 0;
  // A call site from the call's operands (results, callee, arguments, optional prototype).
  // Keeps a matrix instruction's operands with the function; its index.
  virtual std::uint32_t matrixOperation(MatrixOperation operation) = 0;
  // Keeps a texture or surface instruction's operands with the function; its index.
  virtual std::uint32_t textureOperation(TextureOperation operation) = 0;
  virtual std::optional<std::uint32_t> callSite(const ParsedInstruction& call, std::uint32_t callee,
                                                bool indirect) = 0;
  // A hidden per-lane row for the carry flag of add.cc and friends.
  virtual std::uint32_t carry() = 0;
  virtual std::uint32_t smVersion() const = 0;
  virtual bool inKernel() const = 0;
  virtual std::string& error() = 0;
};

// Binds one instruction to its handler. Returns false with resolver.error() set when the
// instruction is malformed; sets `unsupported` (and returns false) when it is valid PTX that the
// interpreter does not execute.
bool bindInstruction(const ParsedInstruction& parsed, OperandResolver& resolver,
                     Instruction& instruction, bool& unsupported);

}  // namespace gpuproxy::server::ptx
