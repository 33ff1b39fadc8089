// sync_roundtrip: what one synchronising call on an idle stream costs the application thread
// through the gpuproxy stub (cuStreamQuery, cuStreamSynchronize), against a raw Cap'n Proto
// Session.submit carrying the same Synchronize record, made directly on the application thread (no
// stub: what the transport and the daemon cost by themselves), and cuDriverGetVersion, which the
// stub answers locally, and cuMemGetInfo, a control call (always a Cap'n Proto call) that the
// daemon answers from the GPU's state.
//
//   sync_roundtrip [--iterations N] [--warmup N] [--rounds N] [--idle-us US] [--smoke]
//
// Back-to-back calls find the daemon (and this thread) hot; the "after idle" rows sleep --idle-us
// before each call, untimed, so that the daemon has gone back to waiting in the kernel first: the
// "from sleep" case. They make 1/20 as many calls as the others.
// Needs a daemon (GPUPROXY_SOCKET, LD_LIBRARY_PATH at the stub); benchmarks/run provides both.
// The measured calls alternate in --rounds rounds so that a noisy machine weighs on all alike.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "benchmarks/bench_support.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/unix_socket.hpp"
#include "protocol/ring_format.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace gpuproxy::bench;
namespace protocol = gpuproxy::protocol;

constexpr const char* kProgram = "sync_roundtrip";

#define CHECK(call)                                                  \
  do {                                                               \
    CUresult result_ = (call);                                       \
    if (result_ != CUDA_SUCCESS) failCuda(kProgram, #call, result_); \
  } while (0)

struct Options {
  long iterations = 20000;  // per call, over all rounds
  long warmup = 500;
  long rounds = 5;
  long idleUs = 1000;
};

void usage() {
  std::printf(
      "usage: sync_roundtrip [--iterations N] [--warmup N] [--rounds N] [--smoke]\n"
      "  --iterations  timed calls of each kind (default 20000)\n"
      "  --warmup      untimed calls of each kind first (default 500)\n"
      "  --rounds      the calls alternate this many times (default 5)\n"
      "  --idle-us     sleep before each call of the \"after idle\" rows (default 1000)\n"
      "  --smoke       a few hundred calls, to check that it runs\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--iterations")) {
      options.iterations = args.integer(1);
    } else if (args.is("--warmup")) {
      options.warmup = args.integer(0);
    } else if (args.is("--rounds")) {
      options.rounds = args.integer(1);
    } else if (args.is("--idle-us")) {
      options.idleUs = args.integer(1);
    } else if (args.is("--smoke")) {
      options.iterations = 200;
      options.warmup = 10;
      options.rounds = 2;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

// A second, stub-free connection to the same daemon, driven from this (the application) thread:
// one attach, one primary context, one idle stream, then bare Session.submit calls carrying one
// Synchronize record each (what cuStreamQuery/cuStreamSynchronize send without a data plane).
class RawSession {
public:
  explicit RawSession(const std::string& socketPath)
      : io_(kj::setupAsyncIo()),
        stream_(io_.lowLevelProvider->wrapUnixSocketFd(
            connectTo(socketPath), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                       kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC)),
        client_(*stream_),
        session_(attach()) {
    auto retain = session_.retainPrimaryContextRequest();
    retain.setDevice(0);
    auto retained = retain.send().wait(io_.waitScope);
    check("retainPrimaryContext", retained.getResult());
    context_ = retained.getContext();
    auto create = session_.createStreamRequest();
    create.setContext(context_);
    create.setFlags(CU_STREAM_NON_BLOCKING);
    auto created = create.send().wait(io_.waitScope);
    check("createStream", created.getResult());
    streamHandle_ = created.getStream();
  }

  // cuStreamQuery's record (`query`) or cuStreamSynchronize's, carried by Session.submit.
  void synchronize(bool query) {
    protocol::ring::Synchronize command;
    command.context = context_;
    command.kind = protocol::ring::SynchronizeKind::kStream;
    command.handle = streamHandle_;
    command.completionToken = 1;
    command.query = query;
    std::array<std::byte, 64> record{};
    const std::size_t bytes = protocol::ring::encode(command, record);
    auto request = session_.submitRequest();
    request.setCommands(kj::arrayPtr(reinterpret_cast<const kj::byte*>(record.data()), bytes));
    auto response = request.send().wait(io_.waitScope);
    auto completions = response.getCompletions();
    auto answer = protocol::ring::decodeCompletion(
        {reinterpret_cast<const std::byte*>(completions.begin()), completions.size()}, {});
    auto* completion = std::get_if<protocol::ring::Completion>(&answer);
    check(query ? "submit(query)" : "submit(synchronize)",
          completion != nullptr ? completion->result : CUDA_ERROR_UNKNOWN);
  }

private:
  static int connectTo(const std::string& path) {
    try {
      return gpuproxy::ipc::connectUnixSocket(path).release();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s: cannot connect to %s: %s\n", kProgram, path.c_str(), error.what());
      std::exit(1);
    }
  }

  static void check(const char* what, std::int32_t result) {
    if (result != CUDA_SUCCESS) failCuda(kProgram, what, static_cast<CUresult>(result));
  }

  protocol::Session::Client attach() {
    auto gateway = client_.bootstrap().castAs<protocol::Gateway>();
    auto request = gateway.attachRequest();
    request.setProtocolVersion(protocol::PROTOCOL_VERSION);
    auto response = request.send().wait(io_.waitScope);
    check("attach", response.getResult());
    return response.getSession();
  }

  kj::AsyncIoContext io_;
  kj::Own<kj::AsyncIoStream> stream_;
  capnp::TwoPartyClient client_;
  protocol::Session::Client session_;
  std::uint64_t context_ = 0;
  std::uint64_t streamHandle_ = 0;
};

struct Measured {
  std::string name;
  std::function<void()> call;
  long idleUs = 0;  // sleep before each call (untimed)
  std::vector<double> samples;
};

void time(Measured& measured, long count, bool keep) {
  if (measured.idleUs > 0) count = std::max(1L, count / 20);
  for (long i = 0; i < count; ++i) {
    if (measured.idleUs > 0) ::usleep(static_cast<useconds_t>(measured.idleUs));
    std::int64_t start = nowNs();
    measured.call();
    std::int64_t end = nowNs();
    if (keep) measured.samples.push_back(static_cast<double>(end - start));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);
  const char* socketPath = std::getenv("GPUPROXY_SOCKET");
  if (!nativeDriver() && (socketPath == nullptr || *socketPath == '\0')) {
    failUsage(kProgram, "GPUPROXY_SOCKET must name the daemon's client socket");
  }

  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  const std::string name = deviceName(device);
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  // With the native driver there is no daemon to call directly.
  std::optional<RawSession> raw;
  if (!nativeDriver()) raw.emplace(socketPath);

  int version = 0;
  std::vector<Measured> calls;
  auto add = [&](std::string name, std::function<void()> call, long idleUs) {
    calls.push_back({std::move(name), std::move(call), idleUs, {}});
  };
  const std::string path = ": " + callPathLabel();
  add(
      nativeDriver() ? "cuDriverGetVersion (native driver)"
                     : "cuDriverGetVersion (stub, answered locally)",
      [&] { CHECK(cuDriverGetVersion(&version)); }, 0);
  if (raw) {
    add(
        "raw Cap'n Proto query record (baseline)", [&] { raw->synchronize(/*query=*/true); }, 0);
    add(
        "raw Cap'n Proto synchronize record", [&] { raw->synchronize(/*query=*/false); }, 0);
  }
  // The ratio column's baseline: the raw Cap'n Proto query, else (native driver) the query below.
  const std::size_t baselineIndex = raw ? 1 : calls.size();
  add(
      "cuStreamQuery" + path, [&] { CHECK(cuStreamQuery(stream)); }, 0);
  add(
      "cuStreamSynchronize" + path, [&] { CHECK(cuStreamSynchronize(stream)); }, 0);
  // A control call: always a Cap'n Proto call, which the daemon answers from the GPU's state.
  std::size_t freeBytes = 0;
  std::size_t totalBytes = 0;
  add(
      "cuMemGetInfo (control call)", [&] { CHECK(cuMemGetInfo(&freeBytes, &totalBytes)); }, 0);
  const std::string idle = " after " + std::to_string(options.idleUs) + " us idle";
  if (raw) {
    add(
        "raw Cap'n Proto query record" + idle, [&] { raw->synchronize(/*query=*/true); },
        options.idleUs);
  }
  add(
      "cuStreamQuery" + idle + path, [&] { CHECK(cuStreamQuery(stream)); }, options.idleUs);
  add(
      "cuStreamSynchronize" + idle + path, [&] { CHECK(cuStreamSynchronize(stream)); },
      options.idleUs);

  for (Measured& measured : calls) time(measured, options.warmup, false);
  for (long round = 0; round < options.rounds; ++round) {
    long count =
        options.iterations / options.rounds + (round < options.iterations % options.rounds ? 1 : 0);
    for (Measured& measured : calls) time(measured, count, true);
  }

  std::printf("## sync_roundtrip\n\n");
  std::printf(
      "Idle non-blocking stream; %ld timed calls of each kind in %ld alternating rounds (the "
      "\"after idle\" rows: 1/20 as many, each after an untimed %ld us sleep); stub device: "
      "%s.\n\n",
      options.iterations, options.rounds, options.idleUs, name.c_str());
  double baseline = summarize(calls[baselineIndex].samples).median;
  Table table({"call", "calls", "median ns", "p90 ns", "p99 ns", "mean ns",
               raw ? "median vs raw capnp" : "median vs its query"});
  for (Measured& measured : calls) {
    LatencySummary summary = summarize(measured.samples);
    table.add({measured.name, std::to_string(summary.samples), formatNs(summary.median),
               formatNs(summary.p90), formatNs(summary.p99), formatNs(summary.mean),
               formatRatio(summary.median / baseline)});
  }
  table.print();
  std::printf(
      "\nclock overhead (two back-to-back steady_clock reads, median): %s ns; "
      "targets: <= 2 us with the daemon spinning, <= 30 us from sleep. "
      "The shared-memory ping-pong floor is ipc_pingpong.\n",
      formatNs(clockOverheadNs()).c_str());
  return 0;
}
