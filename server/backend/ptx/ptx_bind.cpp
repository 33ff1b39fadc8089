// Binding instructions to handlers: opcode qualifiers, routing to the instruction families, and
// the decoded program's validation.

#include <algorithm>
#include <string>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_exec.hpp"
#include "server/backend/ptx/ptx_frontend.hpp"

namespace gpuproxy::server::ptx {

Qualifiers::Qualifiers(std::string_view opcode) {
  std::size_t dot = opcode.find('.');
  base_ = opcode.substr(0, dot);
  while (dot != std::string_view::npos) {
    const std::size_t next = opcode.find('.', dot + 1);
    words_.push_back(
        opcode.substr(dot + 1, next == std::string_view::npos ? next : next - dot - 1));
    dot = next;
  }
  taken_.assign(words_.size(), false);
}

bool Qualifiers::take(std::string_view word) {
  bool found = false;
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (!taken_[i] && words_[i] == word) {
      taken_[i] = true;
      found = true;
      break;
    }
  }
  return found;
}

std::string_view Qualifiers::takeAny(std::initializer_list<std::string_view> words) {
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (taken_[i]) continue;
    for (const std::string_view word : words) {
      if (words_[i] == word) {
        taken_[i] = true;
        return word;
      }
    }
  }
  return {};
}

std::vector<Type> Qualifiers::takeTypes() {
  std::vector<Type> types;
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (taken_[i]) continue;
    // Built by append: GCC 12 at -O3 misreads `"." + std::string(word)` as an overlapping copy
    // (-Wrestrict), which stops a Release build with warnings as errors.
    std::string word(1, '.');
    word.append(words_[i]);
    const Type type = parseType(word);
    if (type != Type::kNone) {
      types.push_back(type);
      taken_[i] = true;
    }
  }
  return types;
}

Space Qualifiers::takeSpace() {
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (taken_[i]) continue;
    const std::string_view word = words_[i];
    Space space = Space::kGeneric;
    if (word == "global") {
      space = Space::kGlobal;
    } else if (word == "shared" || word == "shared::cta") {
      space = Space::kShared;
    } else if (word == "local") {
      space = Space::kLocal;
    } else if (word == "const") {
      space = Space::kConst;
    } else if (word == "param" || word == "param::entry" || word == "param::func") {
      space = Space::kParam;
    } else {
      continue;
    }
    taken_[i] = true;
    return space;
  }
  return Space::kGeneric;
}

Rounding Qualifiers::takeRounding(bool& integral) {
  static constexpr std::pair<std::string_view, Rounding> kModes[] = {
      {"rn", Rounding::kNearest}, {"rz", Rounding::kZero},         {"rm", Rounding::kDown},
      {"rp", Rounding::kUp},      {"rna", Rounding::kNearestAway}, {"rni", Rounding::kNearest},
      {"rzi", Rounding::kZero},   {"rmi", Rounding::kDown},        {"rpi", Rounding::kUp}};
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (taken_[i]) continue;
    for (const auto& [word, mode] : kModes) {
      if (words_[i] == word) {
        taken_[i] = true;
        integral = word.size() == 3 && word != "rna";
        return mode;
      }
    }
  }
  integral = false;
  return Rounding::kDefault;
}

unsigned Qualifiers::takeVector() {
  if (take("v2")) return 2;
  if (take("v4")) return 4;
  if (take("v8")) return 8;
  return 1;
}

void Qualifiers::takeOrderingAndHints() {
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (taken_[i]) continue;
    const std::string_view word = words_[i];
    static constexpr std::string_view kIgnored[] = {"volatile",
                                                    "relaxed",
                                                    "acquire",
                                                    "release",
                                                    "acq_rel",
                                                    "sc",
                                                    "weak",
                                                    "mmio",
                                                    "cta",
                                                    "gpu",
                                                    "sys",
                                                    "cluster",
                                                    "nc",
                                                    "ca",
                                                    "cg",
                                                    "cs",
                                                    "lu",
                                                    "cv",
                                                    "wb",
                                                    "wt",
                                                    "L1::evict_normal",
                                                    "L1::evict_unchanged",
                                                    "L1::evict_first",
                                                    "L1::evict_last",
                                                    "L1::no_allocate",
                                                    "L2::evict_normal",
                                                    "L2::evict_first",
                                                    "L2::evict_last",
                                                    "L2::64B",
                                                    "L2::128B",
                                                    "L2::256B",
                                                    "L2::cache_hint",
                                                    "unified",
                                                    "noinc"};
    if (std::find(std::begin(kIgnored), std::end(kIgnored), word) != std::end(kIgnored)) {
      taken_[i] = true;
    }
  }
}

std::string_view Qualifiers::leftover() const {
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (!taken_[i]) return words_[i];
  }
  return {};
}

bool finishQualifiers(const Qualifiers& qualifiers, OperandResolver& resolver, bool& unsupported) {
  const std::string_view left = qualifiers.leftover();
  if (left.empty()) return true;
  return unsupportedBinding(resolver, unsupported, "qualifier ." + std::string(left));
}

bool expectOperands(const ParsedInstruction& parsed, std::size_t count, OperandResolver& resolver) {
  if (parsed.operands.size() == count) return true;
  return bindError(resolver, "expected " + std::to_string(count) + " operands, found " +
                                 std::to_string(parsed.operands.size()));
}

bool bindSource(Instruction& instruction, int index, const Operand& operand, Type type,
                OperandResolver& resolver) {
  instruction.op[index] = resolver.source(operand, type);
  return instruction.op[index] != kNoRegister;
}

bool bindDestination(Instruction& instruction, int index, const Operand& operand, Type type,
                     OperandResolver& resolver) {
  instruction.op[index] = resolver.destination(operand, type);
  return instruction.op[index] != kNoRegister;
}

bool bindPredicate(Instruction& instruction, int index, const Operand& operand,
                   OperandResolver& resolver) {
  instruction.op[index] = resolver.predicate(operand);
  instruction.predicateOps |= static_cast<std::uint8_t>(1u << index);
  return instruction.op[index] != kNoPredicate;
}

namespace {

bool anyOf(std::string_view base, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), base) != names.end();
}

// The one type an arithmetic instruction works on (the last type written: set.lt.u32.f32 has the
// result type first).
Type arithmeticType(std::string_view opcode) {
  Qualifiers qualifiers(opcode);
  const std::vector<Type> types = qualifiers.takeTypes();
  return types.empty() ? Type::kNone : types.back();
}

}  // namespace

bool bindRegisterList(const Operand& operand, std::size_t count, Type type, bool written,
                      OperandResolver& resolver, std::vector<std::uint32_t>& rows) {
  const std::vector<Operand> lone{operand};
  const std::vector<Operand>& registers =
      operand.kind == Operand::Kind::kVector ? operand.elements : lone;
  if (registers.size() != count) {
    return bindError(resolver, "expected " + std::to_string(count) + " registers");
  }
  for (const Operand& each : registers) {
    const std::uint32_t row =
        written ? resolver.destination(each, type) : resolver.source(each, type);
    if (row == kNoRegister) return false;
    rows.push_back(row);
  }
  return true;
}

bool isMemoryOpcode(std::string_view base) {
  return anyOf(base, {"ld", "ldu", "st", "atom", "red", "cvta", "isspacep", "prefetch", "prefetchu",
                      "membar", "fence", "discard", "applypriority", "createpolicy", "cp"});
}

bool isWarpOpcode(std::string_view base) {
  return anyOf(base, {"shfl", "vote", "match", "redux", "activemask", "elect"});
}

bool isControlOpcode(std::string_view base) {
  return anyOf(base, {"bra", "call", "ret", "exit", "trap", "brkpt", "bar", "barrier", "nanosleep",
                      "pmevent", "griddepcontrol"});
}

std::string_view unsupportedFamily(std::string_view opcode) {
  const std::string_view base = opcode.substr(0, opcode.find('.'));
  const auto startsWith = [&](std::string_view prefix) {
    return opcode.substr(0, prefix.size()) == prefix;
  };
  if (anyOf(base, {"sured", "istypep"})) return "surface reductions and texture type tests";
  if (anyOf(base, {"wgmma", "bmma", "tcgen05"})) return "tensor-core instructions";
  if (startsWith("cp.async.bulk") || startsWith("cp.reduce.async.bulk") || base == "tensormap") {
    return "TMA (bulk asynchronous copies)";
  }
  if (startsWith("barrier.cluster") ||
      anyOf(base, {"mapa", "getctarank", "clusterlaunchcontrol"}) ||
      opcode.find(".shared::cluster") != std::string_view::npos) {
    return "thread-block clusters";
  }
  if (base == "multimem") return "multimem (multicast memory)";
  if (anyOf(base, {"vadd", "vsub", "vabsdiff", "vmin", "vmax", "vshl", "vshr", "vmad", "vset"})) {
    return "scalar video instructions";
  }
  return {};
}

bool isClusterRegister(std::string_view name) {
  const std::string_view base = name.substr(0, name.find('.'));
  return anyOf(base, {"%clusterid", "%nclusterid", "%cluster_ctaid", "%cluster_nctaid",
                      "%cluster_ctarank", "%cluster_nctarank", "%is_explicit_cluster"});
}

bool bindInstruction(const ParsedInstruction& parsed, OperandResolver& resolver,
                     Instruction& instruction, bool& unsupported) {
  Qualifiers qualifiers(parsed.opcode);
  const std::string_view base = qualifiers.base();
  // Whole families the sim does not have: refused by name, before any operand is looked at.
  if (const std::string_view family = unsupportedFamily(parsed.opcode); !family.empty()) {
    return unsupportedBinding(resolver, unsupported, std::string(family));
  }
  // Cluster special registers: the sim launches no clusters, and a cluster-aware kernel given
  // made-up values for them would compute a wrong answer quietly.
  for (const Operand& operand : parsed.operands) {
    if (operand.kind == Operand::Kind::kRegister && isClusterRegister(operand.name)) {
      return unsupportedBinding(
          resolver, unsupported,
          "the cluster special register " + operand.name + "; thread-block clusters");
    }
  }
  if (isControlOpcode(base)) {
    return bindControl(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (isMemoryOpcode(base)) {
    return bindMemory(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (isWarpOpcode(base)) return bindWarp(parsed, qualifiers, resolver, instruction, unsupported);
  if (isVideoOpcode(base)) return bindVideo(parsed, qualifiers, resolver, instruction, unsupported);
  if (isTextureOpcode(base)) {
    return bindTexture(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (anyOf(base, {"wmma", "mma", "ldmatrix", "stmatrix", "movmatrix"})) {
    return bindMatrix(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (base == "mbarrier") {
    return bindAsyncBarrier(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (base == "mov") return bindMove(parsed, qualifiers, resolver, instruction, unsupported);
  if (base == "cvt") return bindConvert(parsed, qualifiers, resolver, instruction, unsupported);
  if (base == "selp" || base == "slct") {
    return bindInteger(parsed, qualifiers, resolver, instruction, unsupported);
  }
  const Type type = arithmeticType(parsed.opcode);
  if (type == Type::kF16 || type == Type::kF16x2 || type == Type::kBf16 || type == Type::kBf16x2) {
    return bindHalf(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (type == Type::kF32 || type == Type::kF64 ||
      anyOf(base, {"rcp", "sqrt", "rsqrt", "sin", "cos", "lg2", "ex2", "tanh", "testp", "copysign",
                   "fma"})) {
    return bindFloat(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (isIntegerOpcode(base)) {
    return bindInteger(parsed, qualifiers, resolver, instruction, unsupported);
  }
  return unsupportedBinding(resolver, unsupported, "an instruction the interpreter does not know");
}

// ---- Validation -------------------------------------------------------------------------------

std::string validateProgram(const Program& program) {
  const auto functions = static_cast<std::uint32_t>(program.functions.size());
  for (std::size_t v = 0; v < program.variables.size(); ++v) {
    const Variable& variable = program.variables[v];
    if (!variable.initializer.empty() && variable.initializer.size() != variable.bytes) {
      return "initializer of " + variable.name + " does not match its size";
    }
    for (const Variable::Relocation& relocation : variable.relocations) {
      if (relocation.bytes == 0 || relocation.bytes > 8 || relocation.offset > variable.bytes ||
          relocation.bytes > variable.bytes - relocation.offset) {
        return "relocation outside " + variable.name;
      }
      if (relocation.function ? relocation.symbol >= functions
                              : relocation.symbol >= program.variables.size()) {
        return "relocation to an unknown symbol in " + variable.name;
      }
    }
    if (variable.space == Space::kShared && !variable.external &&
        variable.sharedOffset + variable.bytes > program.staticSharedBytes) {
      return "shared variable " + variable.name + " outside static shared memory";
    }
    if ((variable.space == Space::kGlobal || variable.space == Space::kConst) &&
        (v >= program.globalOffsets.size() ||
         program.globalOffsets[v] + variable.bytes > program.globalBytes)) {
      return "variable " + variable.name + " outside the module's memory";
    }
  }
  if (program.dynamicSharedOffset < program.staticSharedBytes) return "dynamic shared overlaps";
  for (const Function& function : program.functions) {
    const std::uint32_t rows = function.rows();
    if (!function.defined && !function.code.empty()) return "code in an undefined function";
    if (function.parameterOffsets.size() != function.parameterSizes.size() ||
        function.resultOffsets.size() != function.resultSizes.size()) {
      return "parameter tables of " + function.name + " disagree";
    }
    for (std::size_t i = 0; i < function.parameterOffsets.size(); ++i) {
      if (std::uint64_t{function.parameterOffsets[i]} + function.parameterSizes[i] >
          function.parameterBytes) {
        return "parameter outside the frame of " + function.name;
      }
    }
    for (std::size_t i = 0; i < function.resultOffsets.size(); ++i) {
      if (std::uint64_t{function.resultOffsets[i]} + function.resultSizes[i] >
          function.parameterBytes) {
        return "result outside the frame of " + function.name;
      }
    }
    std::uint64_t end = 0;
    for (const KernelParameter& parameter : function.kernelParameters) {
      if (parameter.offset < end || parameter.alignment == 0 ||
          parameter.offset % parameter.alignment != 0) {
        return "kernel parameters of " + function.name + " out of order";
      }
      end = std::uint64_t{parameter.offset} + parameter.size;
    }
    if (end > function.kernelParameterBytes || function.kernelParameterBytes > 32764) {
      return "kernel parameters of " + function.name + " too large";
    }
    for (const CallSite& site : function.callSites) {
      for (const auto* slots : {&site.arguments, &site.results}) {
        for (const CallSite::Slot& slot : *slots) {
          if (std::uint64_t{slot.callerOffset} + slot.bytes > function.parameterBytes) {
            return "call slot outside the frame of " + function.name;
          }
        }
      }
    }
    for (const Constant& constant : function.constants) {
      if (constant.kind == Constant::Kind::kVariableAddress &&
          constant.symbol >= program.variables.size()) {
        return "constant names an unknown variable";
      }
      if (constant.kind == Constant::Kind::kFunctionAddress && constant.symbol >= functions) {
        return "constant names an unknown function";
      }
      if (constant.kind == Constant::Kind::kLocalAddress && constant.value > function.localBytes) {
        return "local address outside the frame of " + function.name;
      }
    }
    if (function.carryRow != kNoRegister && function.carryRow >= function.registerRows) {
      return "carry row outside the frame";
    }
    bool outside = false;
    const auto bound = [&](const std::uint32_t& row) {
      outside = outside || (row != kNoRegister && row >= rows);
    };
    for (const MatrixOperation& operation : function.matrixOperations) {
      forEachOperationRow(operation, bound);
    }
    for (const TextureOperation& operation : function.textureOperations) {
      forEachOperationRow(operation, bound);
    }
    if (outside) return "matrix or texture operand outside the frame of " + function.name;
    for (const Instruction& instruction : function.code) {
      if (instruction.guard != kNoPredicate && instruction.guard >= function.predicates) {
        return "guard outside the frame of " + function.name;
      }
      for (int k = 0; k < 6; ++k) {
        const std::uint32_t op = instruction.op[k];
        if (op == kNoRegister) continue;
        const bool predicate = (instruction.predicateOps >> k) & 1;
        if (predicate ? op >= function.predicates : op >= rows) {
          return "operand outside the frame of " + function.name;
        }
      }
      if (instruction.source >= function.sourceLines.size()) return "bad source index";
      switch (instruction.flow) {
        case Flow::kPlain:
        case Flow::kMemory:
        case Flow::kWarpSync:
          if (instruction.handler == nullptr) return "instruction without a handler";
          break;
        case Flow::kBranch:
          if (instruction.target >= function.code.size()) return "branch outside " + function.name;
          break;
        case Flow::kCall:
          if (instruction.extra >= function.callSites.size()) return "call without a site";
          if (instruction.op[0] == kNoRegister && instruction.target >= functions) {
            return "call to an unknown function";
          }
          if (instruction.op[0] == kNoRegister) {
            const Function& callee = program.functions[instruction.target];
            const CallSite& site = function.callSites[instruction.extra];
            if (callee.defined && (site.arguments.size() != callee.parameterSizes.size() ||
                                   site.results.size() > callee.resultSizes.size())) {
              return "call site does not match its callee";
            }
          }
          break;
        default:
          break;
      }
    }
  }
  return {};
}

}  // namespace gpuproxy::server::ptx
