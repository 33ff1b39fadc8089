// launch_scaling: aggregate kernel launches per second when 1, 2, 4 and 8 client processes launch
// through the gpuproxy stub into one daemon at once.
//
//   launch_scaling [--clients 1,2,4,8] [--seconds 2] [--batch 256] [--smoke]
//
// Needs a daemon (GPUPROXY_SOCKET, LD_LIBRARY_PATH at the stub); benchmarks/run provides both.
// For each client count this program forks that many children before any CUDA call (a process
// that called cuInit cannot use CUDA in a fork). Each child attaches, loads the kernels and says it
// is ready; when all are, they start together and launch `spin(0)` on their own stream for
// --seconds, synchronising every --batch launches (counted: a sustained rate includes draining),
// then report their count. The baseline is the same program's 1-client run.
#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchmarks/bench_support.hpp"
#include "test_kernels_ptx.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace gpuproxy::bench;

constexpr const char* kProgram = "launch_scaling";

#define CHECK(call)                                                  \
  do {                                                               \
    CUresult result_ = (call);                                       \
    if (result_ != CUDA_SUCCESS) failCuda(kProgram, #call, result_); \
  } while (0)

struct Options {
  std::vector<int> clients{1, 2, 4, 8};
  double seconds = 2.0;
  long batch = 256;
};

void usage() {
  std::printf(
      "usage: launch_scaling [--clients LIST] [--seconds S] [--batch N] [--smoke]\n"
      "  --clients  client process counts to run, comma-separated (default 1,2,4,8)\n"
      "  --seconds  how long every client launches (default 2)\n"
      "  --batch    launches between cuStreamSynchronize calls (default 256)\n"
      "  --smoke    1 and 2 clients for 0.1 s, to check that it runs\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--clients")) {
      if (!parseIntList(args.value(), options.clients)) {
        failUsage(kProgram, "--clients takes positive integers such as 1,2,4,8");
      }
    } else if (args.is("--seconds")) {
      options.seconds = args.number(0.001);
    } else if (args.is("--batch")) {
      options.batch = args.integer(1);
    } else if (args.is("--smoke")) {
      options.clients = {1, 2};
      options.seconds = 0.1;
      options.batch = 64;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

struct ClientReport {
  std::uint64_t launches = 0;
  std::int64_t nanoseconds = 0;
};

bool writeAll(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = ::write(fd, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
  return true;
}

bool readAll(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t got = ::read(fd, bytes, size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    bytes += got;
    size -= static_cast<std::size_t>(got);
  }
  return true;
}

// The child's whole life: set up, report ready, wait for the start (EOF on `go`), launch, report.
[[noreturn]] void runClient(const Options& options, int ready, int go, int results) {
  // A child must never outlive a wedged daemon by much (a parent blocked on it would hang too).
  ::alarm(static_cast<unsigned>(options.seconds) + 120);
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUmodule module;
  CHECK(cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  CUfunction spin;
  CHECK(cuModuleGetFunction(&spin, module, "spin"));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned long long nanoseconds = 0;
  void* params[] = {&nanoseconds};

  char byte = 'r';
  if (!writeAll(ready, &byte, 1)) std::_Exit(1);
  char ignored;
  while (::read(go, &ignored, 1) < 0 && errno == EINTR) {
  }

  ClientReport report;
  const std::int64_t start = nowNs();
  const std::int64_t deadline = start + static_cast<std::int64_t>(options.seconds * 1e9);
  while (nowNs() < deadline) {
    for (long i = 0; i < options.batch; ++i) {
      CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
    }
    CHECK(cuStreamSynchronize(stream));
    report.launches += static_cast<std::uint64_t>(options.batch);
  }
  report.nanoseconds = nowNs() - start;
  if (!writeAll(results, &report, sizeof(report))) std::_Exit(1);
  std::fflush(stdout);
  std::_Exit(0);
}

struct RunOutcome {
  std::vector<ClientReport> reports;
  bool ok = true;
};

RunOutcome runClients(const Options& options, int count) {
  int ready[2], go[2], results[2];
  if (::pipe(ready) != 0 || ::pipe(go) != 0 || ::pipe(results) != 0) {
    std::perror("launch_scaling: pipe");
    std::exit(1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("launch_scaling: fork");
      std::exit(1);
    }
    if (pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      ::close(results[0]);
      runClient(options, ready[1], go[0], results[1]);
    }
    children.push_back(pid);
  }
  ::close(ready[1]);
  ::close(go[0]);
  ::close(results[1]);

  RunOutcome outcome;
  char byte;
  for (int i = 0; i < count; ++i) {
    if (!readAll(ready[0], &byte, 1)) {
      outcome.ok = false;
      break;
    }
  }
  ::close(go[1]);  // EOF: every child starts now
  if (outcome.ok) {
    for (int i = 0; i < count; ++i) {
      ClientReport report;
      if (!readAll(results[0], &report, sizeof(report))) {
        outcome.ok = false;
        break;
      }
      outcome.reports.push_back(report);
    }
  }
  for (pid_t child : children) {
    int status = 0;
    if (!outcome.ok) ::kill(child, SIGKILL);
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) outcome.ok = false;
  }
  ::close(ready[0]);
  ::close(results[0]);
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);

  std::printf("## launch_scaling\n\n");
  std::printf(
      "Each client process launches cuLaunchKernel(spin, 0 ns) on its own non-blocking "
      "stream for %.2f s, cuStreamSynchronize every %ld launches (counted); all clients "
      "start together on one daemon.\n\n",
      options.seconds, options.batch);
  Table table({"clients", "total launches/s", "per client (mean)", "slowest client",
               "fastest client", "total vs 1 client"});
  double baseline = 0;
  for (int count : options.clients) {
    RunOutcome outcome = runClients(options, count);
    if (!outcome.ok) {
      std::fprintf(stderr, "%s: a client with %d clients failed (see above)\n", kProgram, count);
      return 1;
    }
    std::vector<double> rates;
    double total = 0;
    for (const ClientReport& report : outcome.reports) {
      double rate =
          static_cast<double>(report.launches) / (static_cast<double>(report.nanoseconds) / 1e9);
      rates.push_back(rate);
      total += rate;
    }
    if (baseline == 0 || count == 1) baseline = total;
    table.add({std::to_string(count), format("%.0f", total),
               format("%.0f", total / static_cast<double>(count)),
               format("%.0f", *std::min_element(rates.begin(), rates.end())),
               format("%.0f", *std::max_element(rates.begin(), rates.end())),
               formatRatio(total / baseline)});
  }
  table.print();
  std::printf(
      "\nThe ratio column divides by the 1-client total of this run (the first row's "
      "when 1 is not in --clients). The machine's cores are shared by the daemon and every "
      "client.\n");
  return 0;
}
