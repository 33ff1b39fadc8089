// ptx_interpreter: how fast the sim's PTX interpreter runs kernels, in thread-instructions per
// second on one core (no worker threads: the calling thread runs every block), against the same
// computation written as plain C++ in the same run.
//
//   ptx_interpreter [--rounds N] [--workers N] [--smoke]
//
// Kernels (nvcc-built PTX of tests/programs/kernels): vector_add (streaming: loads, a float add,
// a store), reduce_sum (grid-stride loop, warp shuffles, shared memory, an atomic per block) and
// matmul_tiled<16> (shared-memory tiles, __syncthreads, a multiply-add inner loop). In process,
// over host memory: no daemon, no stub.
#include "server/backend/ptx/ptx_interpreter.hpp"
#include "benchmarks/bench_support.hpp"
#include "matmul_ptx.hpp"
#include "reduce_ptx.hpp"
#include "server/backend/ptx/ptx_frontend.hpp"
#include "test_kernels_ptx.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace gpuproxy::bench;
namespace ptx = gpuproxy::server::ptx;

constexpr const char* kProgram = "ptx_interpreter";

// A decoded module over host memory: kernels may touch the buffers added to it.
class Module {
public:
  Module(const char* text, unsigned workers) : interpreter_(workers) {
    ptx::DecodeResult decoded = ptx::decodePtx(text);
    if (!decoded.ok()) {
      std::fprintf(stderr, "%s: cannot decode: %s\n", kProgram, decoded.message.c_str());
      std::exit(1);
    }
    program_ = std::shared_ptr<const ptx::Program>(std::move(decoded.program));
    globals_.resize(std::max<std::uint64_t>(program_->globalBytes, 8));
    executable_ = std::make_unique<ptx::Executable>(
        program_, reinterpret_cast<std::uint64_t>(globals_.data()));
    const std::vector<std::byte> image = executable_->initialImage();
    std::copy(image.begin(), image.end(), globals_.begin());
    ranges_ = executable_->variableRanges(globals_.data());
  }

  void add(void* data, std::size_t bytes) {
    auto* begin = static_cast<std::byte*>(data);
    const auto address = reinterpret_cast<std::uint64_t>(begin);
    ranges_.push_back(ptx::MemoryRange{address, address + bytes, begin, true});
  }

  // Runs `kernel`; returns the thread-instructions it executed.
  std::uint64_t run(const char* kernel, unsigned gridX, unsigned gridY, unsigned blockX,
                    unsigned blockY, const std::vector<std::uint64_t>& arguments,
                    unsigned sharedBytes = 0) {
    const ptx::Function* function = program_->findFunction(kernel);
    if (function == nullptr) {
      std::fprintf(stderr, "%s: no kernel %s\n", kProgram, kernel);
      std::exit(1);
    }
    std::vector<std::byte> parameters(function->kernelParameterBytes);
    for (std::size_t i = 0; i < arguments.size() && i < function->kernelParameters.size(); ++i) {
      std::memcpy(parameters.data() + function->kernelParameters[i].offset, &arguments[i],
                  function->kernelParameters[i].size);
    }
    memory_ = ptx::MemoryMap(ranges_);
    ptx::LaunchRequest request;
    request.executable = executable_.get();
    request.kernel = static_cast<std::uint32_t>(function - program_->functions.data());
    request.grid[0] = gridX;
    request.grid[1] = gridY;
    request.block[0] = blockX;
    request.block[1] = blockY;
    request.dynamicSharedBytes = sharedBytes;
    request.parameters = parameters;
    request.memory = &memory_;
    const ptx::LaunchOutcome outcome = interpreter_.run(request);
    if (outcome.status != CUDA_SUCCESS) {
      std::fprintf(stderr, "%s: %s failed: %s\n", kProgram, kernel, outcome.message.c_str());
      std::exit(1);
    }
    return outcome.threadInstructions;
  }

private:
  ptx::Interpreter interpreter_;
  std::shared_ptr<const ptx::Program> program_;
  std::vector<std::byte> globals_;
  std::unique_ptr<ptx::Executable> executable_;
  std::vector<ptx::MemoryRange> ranges_;
  ptx::MemoryMap memory_;
};

std::uint64_t address(const void* pointer) {
  return reinterpret_cast<std::uint64_t>(pointer);
}

struct Row {
  std::string kernel;
  std::string work;
  double interpreterSeconds = 0;
  double nativeSeconds = 0;
  std::uint64_t threadInstructions = 0;
};

// Best of `rounds` of each side, alternating, so that a noisy machine weighs on both alike.
template <typename Interpret, typename Native>
Row measure(const std::string& kernel, const std::string& work, int rounds, Interpret interpret,
            Native native) {
  Row row{kernel, work, 1e30, 1e30, 0};
  for (int round = 0; round < rounds; ++round) {
    std::int64_t start = nowNs();
    row.threadInstructions = interpret();
    row.interpreterSeconds = std::min(row.interpreterSeconds, (nowNs() - start) * 1e-9);
    start = nowNs();
    native();
    row.nativeSeconds = std::min(row.nativeSeconds, (nowNs() - start) * 1e-9);
  }
  return row;
}

// Keeps the optimiser from deleting the plain C++ baseline.
volatile float gSink = 0;

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  unsigned workers = 0;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (arg == "--workers" && i + 1 < argc) {
      workers = static_cast<unsigned>(std::atoi(argv[++i]));
    } else if (arg == "--smoke") {
      smoke = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: ptx_interpreter [--rounds N] [--workers N] [--smoke]\n");
      return 0;
    } else {
      failUsage(kProgram, "unknown argument " + arg);
    }
  }
  if (smoke) rounds = 1;
  const int elements = smoke ? 1 << 14 : 1 << 22;
  const int size = smoke ? 64 : 256;

  std::vector<Row> rows;
  {
    Module module(gpuproxy::testing::kTestKernelsPtx, workers);
    std::vector<float> a(elements, 1.5f);
    std::vector<float> b(elements, 2.25f);
    std::vector<float> c(elements, 0.0f);
    module.add(a.data(), a.size() * 4);
    module.add(b.data(), b.size() * 4);
    module.add(c.data(), c.size() * 4);
    rows.push_back(measure(
        "vector_add", std::to_string(elements) + " floats", rounds,
        [&] {
          return module.run("vector_add", static_cast<unsigned>(elements / 256), 1, 256, 1,
                            {address(a.data()), address(b.data()), address(c.data()),
                             static_cast<std::uint64_t>(elements)});
        },
        [&] {
          for (int i = 0; i < elements; ++i) c[i] = a[i] + b[i];
          gSink = gSink + c[elements / 2];
        }));
  }
  {
    Module module(gpuproxy::testing::kReducePtx, workers);
    std::vector<float> values(elements, 1.0f);
    float sum = 0;
    module.add(values.data(), values.size() * 4);
    module.add(&sum, sizeof sum);
    rows.push_back(measure(
        "reduce_sum", std::to_string(elements) + " floats", rounds,
        [&] {
          sum = 0;
          return module.run(
              "reduce_sum", 64, 1, 256, 1,
              {address(values.data()), address(&sum), static_cast<std::uint64_t>(elements)});
        },
        [&] {
          float total = 0;
          for (int i = 0; i < elements; ++i) total += values[i];
          gSink = gSink + total;
        }));
  }
  {
    Module module(gpuproxy::testing::kMatmulPtx, workers);
    const std::size_t cells = static_cast<std::size_t>(size) * size;
    std::vector<float> a(cells, 0.5f);
    std::vector<float> b(cells, 2.0f);
    std::vector<float> c(cells, 0.0f);
    module.add(a.data(), cells * 4);
    module.add(b.data(), cells * 4);
    module.add(c.data(), cells * 4);
    rows.push_back(measure(
        "matmul_tiled<16>", std::to_string(size) + "x" + std::to_string(size), rounds,
        [&] {
          const auto n = static_cast<std::uint64_t>(size);
          return module.run("_Z12matmul_tiledILi16EEvPKfS1_Pfiii", size / 16, size / 16, 16, 16,
                            {address(a.data()), address(b.data()), address(c.data()), n, n, n});
        },
        [&] {
          for (int row = 0; row < size; ++row) {
            for (int column = 0; column < size; ++column) {
              float sum = 0;
              for (int i = 0; i < size; ++i) sum += a[row * size + i] * b[i * size + column];
              c[row * size + column] = sum;
            }
          }
          gSink = gSink + c[cells / 2];
        }));
  }

  std::printf("### PTX interpreter, %s (best of %d rounds)\n\n",
              workers == 0
                  ? "one core: no worker threads"
                  : (std::to_string(workers) + " worker threads besides the caller").c_str(),
              rounds);
  std::printf("| kernel | work | interpreter | M thread-instructions/s | plain C++ | ratio |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const Row& row : rows) {
    std::printf("| %s | %s | %.2f ms | %.0f | %.3f ms | %.0fx |\n", row.kernel.c_str(),
                row.work.c_str(), row.interpreterSeconds * 1e3,
                row.threadInstructions / row.interpreterSeconds / 1e6, row.nativeSeconds * 1e3,
                row.interpreterSeconds / row.nativeSeconds);
  }
  return 0;
}
