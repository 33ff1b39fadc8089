// ipc_pingpong: the physical floor under the shared-memory data plane (the baseline that
// RESULTS.md §0 compares synchronising calls with). Two processes exchange 64-byte records
// through the gpuproxy::ipc SPSC rings of one memfd segment, with no daemon, no CUDA and no
// protocol on top:
//
//   cache-line        one 32-bit word each way, both spinning: what the hardware alone costs
//                     (two cache-line transfers), the floor under everything else
//   busy-poll         both sides spin on their rings (the daemon awake, the client spinning)
//   daemon asleep     the daemon side has gone to sleep on its eventfd doorbell before every
//                     request; the client rings it and spins for the reply
//   both asleep       as above, and the client sleeps on the futex completion word too
//
//   ipc_pingpong [--iterations N] [--sleep-iterations N] [--warmup N] [--cpus A,B] [--smoke]
//
// Round trips are timed one by one on the client (steady_clock); the table gives percentiles in
// nanoseconds, and how many doorbell/futex wake-ups each round trip cost (0 when both spin).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_support.hpp"
#include "ipc/doorbell.hpp"
#include "ipc/shared_segment.hpp"
#include "ipc/spsc_ring.hpp"

namespace {

using namespace gpuproxy::bench;
namespace ipc = gpuproxy::ipc;

constexpr const char* kProgram = "ipc_pingpong";
constexpr std::size_t kRingCapacity = 4096;
constexpr std::size_t kRecordBytes = 64;
constexpr std::uint32_t kStop = 0xffffffffu;

enum class Mode { kCacheLine, kBusy, kDaemonAsleep, kBothAsleep };

struct Options {
  long iterations = 200000;
  long sleepIterations = 20000;
  long warmup = 2000;
  std::vector<int> cpus;  // client, daemon
};

void usage() {
  std::printf(
      "usage: ipc_pingpong [--iterations N] [--sleep-iterations N] [--warmup N] [--cpus A,B] "
      "[--smoke]\n"
      "  --iterations        timed round trips with both sides spinning (default 200000)\n"
      "  --sleep-iterations  timed round trips in each sleeping mode (default 20000)\n"
      "  --warmup            untimed round trips first, per mode (default 2000)\n"
      "  --cpus A,B          pin the client to CPU A and the daemon side to CPU B\n"
      "  --smoke             a few round trips per mode, to check that it runs\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--iterations")) {
      options.iterations = args.integer(1);
    } else if (args.is("--sleep-iterations")) {
      options.sleepIterations = args.integer(1);
    } else if (args.is("--warmup")) {
      options.warmup = args.integer(0);
    } else if (args.is("--cpus")) {
      // Not parseIntList: CPU 0 is a valid choice.
      int a = -1;
      int b = -1;
      char extra = 0;
      if (std::sscanf(std::string(args.value()).c_str(), "%d,%d%c", &a, &b, &extra) != 2 || a < 0 ||
          b < 0) {
        failUsage(kProgram, "--cpus takes two CPU numbers, e.g. 0,1");
      }
      options.cpus = {a, b};
    } else if (args.is("--smoke")) {
      options.iterations = 200;
      options.sleepIterations = 20;
      options.warmup = 10;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

void pin(const Options& options, std::size_t which) {
  if (options.cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(options.cpus[which], &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::fprintf(stderr, "%s: cannot pin to CPU %d\n", kProgram, options.cpus[which]);
    std::exit(1);
  }
}

// The segment: request ring (client → daemon), reply ring (daemon → client), completion word.
struct Channel {
  static constexpr std::size_t kRingBytes = ipc::ringRegionBytes(kRingCapacity);
  Channel()
      : segment(ipc::SharedSegment::create("ipc-pingpong", 2 * kRingBytes + 64)),
        doorbell(ipc::makeEventFd()) {
    ipc::initializeRing(requests(), kRingCapacity);
    ipc::initializeRing(replies(), kRingCapacity);
  }
  std::span<std::byte> requests() const { return segment.bytes().subspan(0, kRingBytes); }
  std::span<std::byte> replies() const { return segment.bytes().subspan(kRingBytes, kRingBytes); }
  ipc::CompletionWord& completion() const {
    return *reinterpret_cast<ipc::CompletionWord*>(segment.data() + 2 * kRingBytes);
  }

  ipc::SharedSegment segment;
  ipc::UniqueFd doorbell;
};

std::uint32_t sequenceOf(const std::vector<std::byte>& record) {
  std::uint32_t value = 0;
  std::memcpy(&value, record.data(), sizeof(value));
  return value;
}

std::atomic_ref<std::uint32_t> word(ipc::CompletionWord& completion, bool reply) {
  return std::atomic_ref<std::uint32_t>(reply ? completion.waiters : completion.value);
}

// The daemon's side: answers every request until kStop.
int serve(const Channel& channel, Mode mode) {
  if (mode == Mode::kCacheLine) {
    // Request in `value`, reply in `waiters` (the futex is not used in this mode).
    std::uint32_t last = 0;
    for (;;) {
      std::uint32_t sequence;
      while ((sequence = word(channel.completion(), false).load(std::memory_order_acquire)) ==
             last) {
        ipc::cpuRelax();
      }
      if (sequence == kStop) return 0;
      word(channel.completion(), true).store(sequence, std::memory_order_release);
      last = sequence;
    }
  }
  ipc::RingReader requests(channel.requests(), kRingCapacity);
  ipc::RingWriter replies(channel.replies(), kRingCapacity);
  ipc::DoorbellWaiter waiter(requests.consumerSleeping(), channel.doorbell.get());
  ipc::CompletionPublisher completions(channel.completion());
  std::uint32_t published = 0;
  std::vector<std::byte> record;
  for (;;) {
    ipc::RingStatus status;
    if (mode == Mode::kBusy) {
      while ((status = requests.read(record)) == ipc::RingStatus::kEmpty) ipc::cpuRelax();
    } else {
      // No spinning at all: every request finds this side asleep.
      waiter.wait([&] { return requests.pending(); }, 0, std::chrono::milliseconds(-1));
      status = requests.read(record);
    }
    if (status != ipc::RingStatus::kOk) return 1;
    const std::uint32_t sequence = sequenceOf(record);
    if (sequence == kStop) return 0;
    if (mode == Mode::kBothAsleep) {
      completions.publishMore(sequence - published);
      published = sequence;
    } else if (replies.tryWrite(record) != ipc::RingStatus::kOk) {
      return 2;
    }
  }
}

struct Result {
  std::vector<double> samples;
  std::uint64_t wakeups = 0;
};

Result measure(const Options& options, Mode mode, long iterations, long idleUs = 0) {
  Channel channel;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (child == 0) {
    pin(options, 1);
    ::_exit(serve(channel, mode));
  }

  ipc::RingWriter requests(channel.requests(), kRingCapacity);
  ipc::RingReader replies(channel.replies(), kRingCapacity);
  ipc::DoorbellRinger ringer(requests.consumerSleeping(), channel.doorbell.get());
  ipc::CompletionWaiter completions(channel.completion());
  std::vector<std::byte> record(kRecordBytes);
  std::vector<std::byte> reply;
  Result result;
  result.samples.reserve(static_cast<std::size_t>(iterations));

  auto roundTrip = [&](std::uint32_t sequence) {
    if (mode == Mode::kCacheLine) {
      word(channel.completion(), false).store(sequence, std::memory_order_release);
      while (word(channel.completion(), true).load(std::memory_order_acquire) != sequence) {
        ipc::cpuRelax();
      }
      return;
    }
    std::memcpy(record.data(), &sequence, sizeof(sequence));
    while (requests.tryWrite(record) != ipc::RingStatus::kOk) ipc::cpuRelax();
    ringer.ring();
    if (mode == Mode::kBothAsleep) {
      completions.wait([sequence](std::uint32_t value) { return value == sequence; }, 0,
                       std::chrono::milliseconds(-1));
      return;
    }
    ipc::RingStatus status;
    while ((status = replies.read(reply)) == ipc::RingStatus::kEmpty) ipc::cpuRelax();
    if (status != ipc::RingStatus::kOk || sequenceOf(reply) != sequence) {
      std::fprintf(stderr, "%s: bad reply (%s)\n", kProgram, ipc::toString(status));
      std::exit(1);
    }
  };
  // In the sleeping modes, wait until the daemon side has announced sleep and had time to block,
  // so that each timed round trip really starts from sleep.
  auto untilAsleep = [&] {
    if (mode == Mode::kCacheLine || mode == Mode::kBusy) return;
    while (std::atomic_ref<std::uint32_t>(requests.consumerSleeping()).load() == 0) {
      ipc::cpuRelax();
    }
    if (idleUs > 0) {
      // Both sides idle, as an application between bursts: the CPUs may drop into idle states,
      // which is what "from sleep" costs on this machine.
      ::usleep(static_cast<useconds_t>(idleUs));
      return;
    }
    const std::int64_t until = nowNs() + 20000;
    while (nowNs() < until) ipc::cpuRelax();
  };

  std::uint32_t sequence = 1;
  for (long i = 0; i < options.warmup; ++i) {
    untilAsleep();
    roundTrip(sequence++);
  }
  const std::uint64_t wakeupsBefore = ringer.wakeupsSent();
  for (long i = 0; i < iterations; ++i) {
    untilAsleep();
    const std::int64_t start = nowNs();
    roundTrip(sequence++);
    result.samples.push_back(static_cast<double>(nowNs() - start));
  }
  result.wakeups = ringer.wakeupsSent() - wakeupsBefore;

  if (mode == Mode::kCacheLine) word(channel.completion(), false).store(kStop);
  const std::uint32_t stop = kStop;
  std::memcpy(record.data(), &stop, sizeof(stop));
  while (requests.tryWrite(record) != ipc::RingStatus::kOk) ipc::cpuRelax();
  ringer.ring();
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s: daemon side failed (status %d)\n", kProgram, status);
    std::exit(1);
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  pin(options, 0);
  std::printf("## ipc_pingpong: round trip of a %zu-byte record between two processes\n\n",
              kRecordBytes);
  std::printf("CPUs: %s; clock read overhead %s ns (included in every sample)\n\n",
              options.cpus.empty() ? "not pinned"
                                   : (std::to_string(options.cpus[0]) + " (client), " +
                                      std::to_string(options.cpus[1]) + " (daemon side)")
                                         .c_str(),
              formatNs(clockOverheadNs()).c_str());

  struct Row {
    const char* name;
    Mode mode;
    long iterations;
    long idleUs = 0;
  };
  const Row rows[] = {
      {"cache-line ping-pong (hardware floor)", Mode::kCacheLine, options.iterations},
      {"shm ring, busy-poll both sides", Mode::kBusy, options.iterations},
      {"shm ring, daemon asleep (eventfd wake), client spins", Mode::kDaemonAsleep,
       options.sleepIterations},
      {"shm ring, both asleep (eventfd wake + futex reply)", Mode::kBothAsleep,
       options.sleepIterations},
      {"shm ring, both asleep, after 1000 us idle", Mode::kBothAsleep,
       std::max(1L, options.sleepIterations / 20), 1000},
  };
  Table table({"path", "iterations", "p50 ns", "p90 ns", "p99 ns", "mean ns", "wake-ups/iter"});
  for (const Row& row : rows) {
    Result result = measure(options, row.mode, row.iterations, row.idleUs);
    const LatencySummary summary = summarize(std::move(result.samples));
    table.add({row.name, std::to_string(row.iterations), formatNs(summary.median),
               formatNs(summary.p90), formatNs(summary.p99), formatNs(summary.mean),
               format("%.2f",
                      static_cast<double>(result.wakeups) / static_cast<double>(row.iterations))});
  }
  table.print();
  return 0;
}
