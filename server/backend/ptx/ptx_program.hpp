#pragma once
// The decoded form of a PTX module: what the front end (ptx_frontend.hpp) makes of the text once,
// at module load, and what the interpreter (ptx_interpreter.hpp) executes. Nothing here refers to
// text: registers are rows of a frame, labels are instruction indices, symbols are resolved to
// offsets or to module variables, immediates are constant rows, and every instruction carries the
// handler that executes it.
//
// Register model: every function has a frame of 64-bit rows, each holding one value per lane of a
// warp (rows are lane-major: row r, lane l at regs[r * 32 + l]). A writer stores the full 64 bits
// (zero- or sign-extended); a reader reads only the bits of its type, so a 32-bit register never
// needs masking. Predicates are one 32-bit lane mask each. Immediates and symbol addresses are
// constant rows filled when a frame is made.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpuproxy::server::ptx {

inline constexpr std::uint32_t kWarpSize = 32;
inline constexpr std::uint32_t kNoRegister = 0xffffffffu;
inline constexpr std::uint32_t kNoPredicate = 0xffffffffu;
// Shared memory reserved per block for the system (cooperative groups' multi-warp scratch): the
// region %reserved_smem_offset_begin .. _end; _0 and _1 each start half of it.
inline constexpr std::uint32_t kReservedSharedBytes = 1024;

// State spaces of memory instructions and of variables.
enum class Space : std::uint8_t { kGeneric, kGlobal, kShared, kLocal, kConst, kParam };

// How the interpreter must treat an instruction beyond its handler.
enum class Flow : std::uint8_t {
  kPlain,     // the handler does everything; the next instruction follows
  kMemory,    // as kPlain, but the handler may fault (returns false)
  kBranch,    // bra: target in `target`
  kCall,      // call: callee in `callee` (or indirect through op[0])
  kReturn,    // ret
  kExit,      // exit
  kBarrier,   // bar.sync / barrier.sync / bar.red / bar.arrive
  kWarpSync,  // shfl.sync, vote.sync, match.sync, redux.sync, bar.warp.sync: needs its mask's lanes
  kSleep,     // nanosleep
  kTrap,      // trap
  kBreakpoint  // brkpt: a no-op without a debugger
};

struct Instruction;
struct ExecContext;
// Executes `instruction` for the lanes in `mask`. Returns false when it faulted (the fault is
// recorded in the context).
using Handler = bool (*)(ExecContext& context, const Instruction& instruction, std::uint32_t mask);

// One decoded instruction. Operands are frame rows (registers, constants) or predicate indices,
// as the handler expects them.
struct Instruction {
  Handler handler = nullptr;
  Flow flow = Flow::kPlain;
  std::uint8_t guardNegated = 0;       // the guard is @!p
  std::uint8_t space = 0;              // Space of a memory access
  std::uint8_t width = 0;              // bytes per element of a memory access (or type width)
  std::uint8_t vector = 1;             // elements of a vector access
  std::uint8_t flags = 0;              // handler-specific
  std::uint8_t predicateOps = 0;       // bit k: op[k] is a predicate index, not a row
  std::uint16_t source = 0;            // index into Function::sourceLines (for messages)
  std::uint32_t guard = kNoPredicate;  // predicate index
  std::uint32_t op[6] = {kNoRegister, kNoRegister, kNoRegister,
                         kNoRegister, kNoRegister, kNoRegister};
  std::int64_t immediate = 0;  // address offset, shift, lut, barrier id, ...
  std::uint32_t target = 0;    // branch target (instruction index) or callee
  std::uint32_t extra = 0;     // handler-specific (call site index, special register)
};

// A module-scope variable (.global, .const) or a per-kernel/per-module .shared one.
struct Variable {
  std::string name;
  Space space = Space::kGlobal;
  std::uint64_t bytes = 0;
  std::uint32_t alignment = 1;
  std::vector<std::uint8_t> initializer;  // empty: zeros
  // Addresses of variables or functions to patch into the initializer once they are known: the
  // address of `symbol` (a variable, or a function when `function`) plus `addend`, shifted right
  // by `shift` bits, stored in `bytes` bytes at `offset`.
  struct Relocation {
    std::uint64_t offset = 0;
    std::uint32_t symbol = 0;
    bool function = false;
    bool generic = false;  // generic(sym): a .shared/.local symbol's generic address
    std::int64_t addend = 0;
    std::uint8_t bytes = 8;
    std::uint8_t shift = 0;
  };
  std::vector<Relocation> relocations;
  std::uint64_t sharedOffset = 0;  // .shared: offset in the block's shared memory
  bool external = false;           // .extern .shared (dynamic shared memory) or .extern .global
  // .attribute(.managed) (__managed__): memory the host reaches at the same address. Placed
  // with the module's other variables until its client gives it host-visible memory
  // (Executable's placements).
  bool managed = false;
};

// A constant row of a frame: an immediate, an address of a variable or function, or a local
// (stack) address that depends on where the frame sits.
struct Constant {
  enum class Kind : std::uint8_t { kValue, kVariableAddress, kFunctionAddress, kLocalAddress };
  Kind kind = Kind::kValue;
  std::uint64_t value = 0;   // kValue: the bits; kLocalAddress: offset in the frame
  std::uint32_t symbol = 0;  // variable or function index
  std::int64_t addend = 0;
};

// A call's arguments and results: slots of the caller's parameter block (its call-site .param
// declarations), copied at call to the callee's parameters in order and back from its results at
// return.
struct CallSite {
  struct Slot {
    std::uint32_t callerOffset = 0;
    std::uint32_t bytes = 0;
  };
  std::vector<Slot> arguments;
  std::vector<Slot> results;
};

// A warp's matrix instruction (wmma.load, wmma.store, wmma.mma): its fragments are more registers
// than an Instruction holds, so they live here, found by the instruction's `extra`.
enum class MatrixElement : std::uint8_t { kF16, kBf16, kTf32, kF32, kF64, kS8, kU8, kS32 };

struct MatrixOperation {
  // wmma.load, wmma.store, wmma.mma (fragments laid out as the sim chooses: CUDA leaves it to the
  // implementation); mma.sync, ldmatrix, stmatrix and movmatrix (fragments laid out as the PTX
  // ISA defines them, which programs rely on).
  enum class Kind : std::uint8_t {
    kLoad,
    kStore,
    kMultiplyAccumulate,
    kMmaSync,
    kLoadMatrices,
    kStoreMatrices,
    kTransposeMatrix
  };
  Kind kind = Kind::kLoad;
  std::uint8_t m = 0;  // the shape: A is m x k, B k x n, C and D m x n
  std::uint8_t n = 0;
  std::uint8_t k = 0;
  // kLoad/kStore: which matrix ('a', 'b', 'c' or 'd'), its layout in memory and its stride (a
  // row holding it in elements, or kNoRegister for the layout's default); the address is the
  // instruction's op[4] + immediate in instruction.space, as for ld/st.
  char matrix = 'a';
  bool rowMajor = true;
  std::uint32_t stride = kNoRegister;
  bool saturate = false;  // kMultiplyAccumulate, kMmaSync: .satfinite
  // kLoadMatrices/kStoreMatrices: how many 8 x 8 matrices of 16-bit elements (.x1, .x2, .x4) and
  // whether each is transposed on the way (.trans); the address is op[4] + immediate.
  std::uint8_t matrices = 1;
  bool transpose = false;
  // kLoad/kStore: fragments[0] and elements[0]; kMultiplyAccumulate, kMmaSync: d, a, b, c;
  // kLoadMatrices/kStoreMatrices: fragments[0], one register per matrix; kTransposeMatrix:
  // fragments[0] the result, fragments[1] the source.
  MatrixElement elements[4] = {};
  std::vector<std::uint32_t> fragments[4];
};

// A texture or surface instruction (tex, tld4, txq, suld.b, sust.b, suq): the handle of a header
// in the client's memory (protocol/texture_header.hpp) and more registers than an Instruction
// holds, found by the instruction's `extra`.
struct TextureOperation {
  enum class Kind : std::uint8_t {
    kSample,        // tex: filtered (or point) fetch of all four channels
    kGather,        // tld4: one channel of the four texels bilinear filtering would use
    kQuery,         // txq
    kSurfaceLoad,   // suld.b
    kSurfaceStore,  // sust.b
    kSurfaceQuery   // suq
  };
  // What tex and tld4 return: floats (each channel converted, normalised or filtered), or the
  // channels' integers.
  enum class Result : std::uint8_t { kF32, kS32, kU32 };
  // suld/sust outside the surface: fault, clamp to the edge, or read zero and drop the store.
  enum class Boundary : std::uint8_t { kTrap, kClamp, kZero };
  // txq/suq: what is asked.
  enum class Query : std::uint8_t {
    kWidth,
    kHeight,
    kDepth,
    kNormalizedCoordinates,
    kFilterMode,
    kAddressMode0,
    kAddressMode1,
    kAddressMode2
  };
  Kind kind = Kind::kSample;
  std::uint8_t dimensions = 1;  // the geometry: .1d, .2d, .3d (.a1d, .a2d: 1, 2 and layered)
  bool layered = false;
  bool cube = false;                  // .cube, .acube: the coordinates are a direction
  std::uint32_t layer = kNoRegister;  // layered: the row holding the layer index
  std::uint8_t component = 0;         // tld4: .r .g .b .a
  bool integerCoordinates = false;
  Result result = Result::kF32;
  Boundary boundary = Boundary::kTrap;
  Query query = Query::kWidth;
  std::uint8_t elementBytes = 4;  // suld/sust: .b8 .b16 .b32 .b64
  std::uint32_t handle = kNoRegister;
  std::vector<std::uint32_t> coordinates;
  // Destinations (tex, tld4, txq, suld, suq) or sources (sust), one row each.
  std::vector<std::uint32_t> values;
};

// Every row an operation names besides its instruction's op[] (kNoRegister where unused), for
// the front end to place its constant rows and for validateProgram to bound them. `Operation` is
// MatrixOperation or TextureOperation, const or not; `visit` takes the row by reference.
template <class Operation, class Visit>
void forEachOperationRow(Operation& operation, Visit&& visit) {
  if constexpr (requires { operation.fragments; }) {
    visit(operation.stride);
    for (auto& fragment : operation.fragments) {
      for (auto& row : fragment) visit(row);
    }
  } else {
    visit(operation.handle);
    visit(operation.layer);
    for (auto& row : operation.coordinates) visit(row);
    for (auto& row : operation.values) visit(row);
  }
}

struct KernelParameter {
  std::string name;
  std::uint32_t offset = 0;
  std::uint32_t size = 0;
  std::uint32_t alignment = 1;
};

struct Function {
  std::string name;
  bool isKernel = false;
  bool defined = false;  // has a body
  bool builtin = false;  // extern function the interpreter provides (vprintf, ...)
  std::uint32_t builtinId = 0;
  std::vector<Instruction> code;
  std::vector<Constant> constants;  // rows registerRows .. registerRows + constants.size()
  std::uint32_t registerRows = 0;   // declared registers (and hidden ones: carry)
  std::uint32_t predicates = 0;
  std::uint32_t carryRow = kNoRegister;
  std::uint32_t rows() const { return registerRows + static_cast<std::uint32_t>(constants.size()); }
  // Parameter block per lane: own parameters and results first, then call-site declarations.
  std::uint32_t parameterBytes = 0;
  // Distance between two lanes' parameter blocks: whole 16-byte units, so that a parameter
  // aligned in the block (up to .v4.b32 / .b128) is aligned in host memory for every lane.
  std::uint32_t parameterStride() const { return (parameterBytes + 15u) & ~15u; }
  std::vector<std::uint32_t> parameterOffsets;  // .func: its incoming parameters
  std::vector<std::uint32_t> parameterSizes;
  std::vector<std::uint32_t> resultOffsets;  // .func: its results
  std::vector<std::uint32_t> resultSizes;
  std::uint32_t localBytes = 0;  // its .local variables (stack frame)
  std::uint32_t localAlignment = 8;
  std::vector<CallSite> callSites;
  std::vector<MatrixOperation> matrixOperations;
  std::vector<TextureOperation> textureOperations;
  // Kernels only.
  std::vector<KernelParameter> kernelParameters;
  std::uint32_t kernelParameterBytes = 0;
  std::uint32_t maxThreads = 0;                  // from .maxntid / .reqntid; 0: none
  std::uint32_t minBlocksPerSm = 0;              // .minnctapersm; 0: none
  std::uint32_t maxRegisters = 0;                // .maxnreg; 0: none
  std::uint32_t requiredThreads[3] = {0, 0, 0};  // .reqntid; 0: none
  std::uint32_t ownSharedBytes = 0;              // this kernel's own .shared variables
  // Lines of the source for messages ("ld.global.f32 %f1, [%rd4]" at line N).
  std::vector<std::string> sourceLines;
  // Why the interpreter cannot run it (an instruction it does not execute, or a call to a
  // function that has one); empty when it can. Such a function has no code: its module loads if
  // another kernel of it can run, and only launching this one is refused.
  std::string unsupported;
};

// Everything a module holds, decoded.
struct Program {
  std::vector<Function> functions;
  std::vector<Variable> variables;  // .global, .const and .shared
  std::uint32_t ptxMajor = 0;
  std::uint32_t ptxMinor = 0;
  std::uint32_t smVersion = 0;  // .target sm_XX
  // Shared memory: module-wide layout. Every .shared variable has one offset; dynamic shared
  // memory (.extern .shared) starts at dynamicSharedOffset for every kernel.
  std::uint64_t staticSharedBytes = 0;
  std::uint64_t dynamicSharedOffset = 0;
  // Whether a kernel reads %reserved_smem_offset_*: each block then gets the reserved shared
  // memory a GPU of compute capability 8.0+ sets aside (kReservedSharedBytes, which the device
  // reports as CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK), after its own.
  bool usesReservedShared = false;
  // The module's .global/.const variables, laid out in one device allocation.
  std::uint64_t globalBytes = 0;
  std::uint64_t constOffset = 0;             // .const variables from here on: read-only to kernels
  std::vector<std::uint64_t> globalOffsets;  // per variable (shared ones: unused)
  // Longest call chain's local bytes is unknown with recursion; the interpreter gives each thread
  // a stack and faults when a call would overflow it.
  bool usesPrintf = false;
  bool usesHeap = false;  // calls malloc or free: needs a device heap

  const Function* findFunction(const std::string& name) const;
  const Variable* findVariable(const std::string& name) const;
};

// Builtin extern functions the interpreter provides.
enum class Builtin : std::uint32_t {
  kNone = 0,
  kVprintf,
  kAssertFail,
  kMalloc,
  kFree,
  kAlignedMalloc,  // __nv_aligned_device_malloc
  // cudaGraphSetConditional(handle, value): the handle of a conditional graph node is the device
  // address of its 32-bit value (client/stub/api/graphs.cpp), which the call stores.
  kGraphSetConditional,
};

}  // namespace gpuproxy::server::ptx
