// shard_message: what a message to a GPU's thread of its own adds to a control call
// (docs/architecture.md §2, "How sessions and GPUs talk"): each control call that reaches a GPU,
// and each ring drain a control call needs, is a round trip from gpuproxyd's main thread to that
// GPU's thread (GpuThread). This measures that round trip on its own, in one
// process, with no daemon, no CUDA and no protocol: the calling thread sends an empty function
// to N shard threads with kj::Executor::executeAsync and waits for every answer. Each thread runs
// a kj event loop set up as the daemon's (setupAsyncIo, the port polled every 4 busy turns, as
// kDataPlaneBusyPollInterval in server/data_plane/data_plane.hpp says):
//
//   idle      the shard threads sleep in epoll until the message wakes them (no client active)
//   spinning  the shard threads' loops keep turning, as the data-plane loop does while a client
//             is active (kj::evalLater, the port polled every 4 turns); only with fewer spinning
//             threads than CPUs, else it measures the OS scheduler
//   polling   the shard thread sleeps, and the caller polls its own loop for the answer instead
//             of sleeping until it comes: what a caller that spun while it waits would pay
//             (benchmarks/RESULTS.md §21 tried that in gpuproxyd's main thread)
//
// The baseline, in the same run: a turn of the caller's own loop (kj::evalLater and wait), the
// least any message can cost. A row beside it sends the message to the caller's own executor
// (kj::Executor::executeAsync on its own thread): what each control call's message to its GPU
// cost while every GPU was the event loop's (server/gpu/gpu_messages.hpp).
//
//   shard_message [--iterations N] [--warmup N] [--rounds N] [--smoke]
//
// Round trips are timed one by one on the calling thread (steady_clock); the rows alternate in
// --rounds rounds so that a noisy machine weighs on all alike.
#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/vector.h>

#include "benchmarks/bench_support.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpuproxy::bench;

constexpr const char* kProgram = "shard_message";
// As gpuproxyd's loops (kDataPlaneBusyPollInterval): a busy loop still looks at its port.
constexpr unsigned kBusyPollInterval = 4;

struct Options {
  long iterations = 20000;  // per row, over all rounds
  long warmup = 500;        // per row and round
  long rounds = 5;
};

void usage() {
  std::printf(
      "usage: shard_message [--iterations N] [--warmup N] [--rounds N] [--smoke]\n"
      "  --iterations  timed round trips per row, over all rounds (default 20000)\n"
      "  --warmup      untimed round trips per row and round (default 500)\n"
      "  --rounds      rounds the rows alternate in (default 5)\n"
      "  --smoke       a few round trips per row, to check that it runs\n");
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
    } else if (args.is("--smoke")) {
      options.iterations = 50;
      options.warmup = 5;
      options.rounds = 1;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

// Keeps a loop turning until it is destroyed.
kj::Promise<void> spinForever() {
  return kj::evalLater([] { return spinForever(); });
}

// A thread with a kj event loop of its own, reachable through its executor; stopped and joined
// on destruction.
class ShardThread {
public:
  explicit ShardThread(bool spinning) {
    std::promise<kj::Own<const kj::Executor>> ready;
    std::future<kj::Own<const kj::Executor>> executor = ready.get_future();
    thread_ = std::thread([this, spinning, &ready] {
      kj::AsyncIoContext io = kj::setupAsyncIo();
      io.waitScope.setBusyPollInterval(kBusyPollInterval);
      auto stop = kj::newPromiseAndFulfiller<void>();
      stop_ = kj::mv(stop.fulfiller);
      kj::Promise<void> spin = kj::READY_NOW;
      if (spinning) spin = spinForever().eagerlyEvaluate(nullptr);
      ready.set_value(kj::getCurrentThreadExecutor().addRef());
      stop.promise.wait(io.waitScope);
      stop_ = nullptr;
    });
    executor_ = executor.get();
  }
  ~ShardThread() {
    executor_->executeSync([this] { stop_->fulfill(); });
    thread_.join();
  }
  ShardThread(const ShardThread&) = delete;
  ShardThread& operator=(const ShardThread&) = delete;

  // Resolves on the calling thread's loop once this thread has run an (empty) message.
  kj::Promise<void> message() const {
    return executor_->executeAsync([] {});
  }

private:
  std::thread thread_;
  kj::Own<const kj::Executor> executor_;
  kj::Own<kj::PromiseFulfiller<void>> stop_;  // touched on the shard thread only
};

struct Row {
  std::string label;
  unsigned shards = 0;  // 0: the baseline, a turn of the caller's own loop
  bool spinning = false;
  std::vector<double> samples;
  // With no shards: a message to the caller's own executor instead of a turn of its loop (what
  // a control call paid while every GPU was the event loop's: server/gpu/gpu_messages.hpp).
  bool ownExecutor = false;
  // The caller polls its loop for the answers instead of sleeping in epoll until they come.
  bool callerPolls = false;
};

void measure(Row& row, long iterations, long warmup, kj::WaitScope& waitScope) {
  std::vector<std::unique_ptr<ShardThread>> shards;
  for (unsigned i = 0; i < row.shards; ++i) {
    shards.push_back(std::make_unique<ShardThread>(row.spinning));
  }
  auto roundTrip = [&] {
    if (shards.empty() && row.ownExecutor) {
      kj::getCurrentThreadExecutor().executeAsync([] {}).wait(waitScope);
      return;
    }
    if (shards.empty()) {
      kj::evalLater([] {}).wait(waitScope);
      return;
    }
    kj::Vector<kj::Promise<void>> answers(shards.size());
    for (const auto& shard : shards) answers.add(shard->message());
    auto joined = kj::joinPromises(answers.releaseAsArray());
    if (row.callerPolls) {
      while (!joined.poll(waitScope)) {
      }
    }
    joined.wait(waitScope);
  };
  for (long i = 0; i < warmup; ++i) roundTrip();
  for (long i = 0; i < iterations; ++i) {
    const std::int64_t start = nowNs();
    roundTrip();
    row.samples.push_back(static_cast<double>(nowNs() - start));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());

  std::vector<Row> rows;
  rows.push_back({"turn of the caller's own loop (baseline)", 0, false, {}});
  rows.push_back(
      {"to the caller's own executor (one loop for every GPU, as before)", 0, false, {}, true});
  for (unsigned shards : {1u, 2u, 4u}) {
    rows.push_back(
        {"to " + std::to_string(shards) + " idle shard thread" + (shards > 1 ? "s, joined" : ""),
         shards,
         false,
         {}});
  }
  rows.push_back({"to 1 idle shard thread, the caller polling", 1, false, {}, false, true});
  for (unsigned shards : {1u, 2u, 4u}) {
    if (shards >= cpus) continue;  // more spinners than CPUs measures the OS scheduler
    rows.push_back({"to " + std::to_string(shards) + " spinning shard thread" +
                        (shards > 1 ? "s, joined" : ""),
                    shards,
                    true,
                    {}});
  }

  kj::AsyncIoContext io = kj::setupAsyncIo();
  io.waitScope.setBusyPollInterval(kBusyPollInterval);
  const long perRound = std::max(1L, options.iterations / options.rounds);
  for (long round = 0; round < options.rounds; ++round) {
    for (Row& row : rows) measure(row, perRound, options.warmup, io.waitScope);
  }

  std::printf(
      "shard_message: a round trip from the calling thread's kj loop to N shard threads' "
      "loops (kj::Executor::executeAsync) and back; %u CPUs, clock overhead %s ns\n\n",
      cpus, formatNs(clockOverheadNs()).c_str());
  const double baseline = summarize(rows.front().samples).median;
  Table table({"round trip", "round trips", "median ns", "p90 ns", "p99 ns", "mean ns",
               "median vs own loop"});
  for (const Row& row : rows) {
    const LatencySummary summary = summarize(row.samples);
    table.add({row.label, std::to_string(summary.samples), formatNs(summary.median),
               formatNs(summary.p90), formatNs(summary.p99), formatNs(summary.mean),
               formatRatio(summary.median / baseline)});
  }
  table.print();
  return 0;
}
