#pragma once
// Real processes for tests: the daemon, driver-API programs run through the stub, gpuproxyctl.
// Every process a test starts is stopped by the test, by its PID.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuproxy::testing {

// The build tree (from $GPUPROXY_BUILD_DIR, which ctest sets).
std::string buildDir();
// gpuproxyd, gpuproxyctl and the stub: the build tree's, or with GPUPROXY_TEST_INSTALL_ROOT set,
// those of scripts/package's tarball unpacked there (under its usr/local).
std::string daemonBinary();                          // build/bin/gpuproxyd
std::string ctlBinary();                             // build/bin/gpuproxyctl
std::string stubDirectory();                         // build/lib/gpuproxy (holds libcuda.so.1)
std::string programBinary(const std::string& name);  // build/tests/programs/NAME

// A fresh directory under /tmp with a short name (Unix socket paths must stay under 108 bytes),
// removed with its contents on destruction.
class TempDir {
public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

private:
  std::string path_;
};

struct ExitStatus {
  int code = -1;   // exit code, or -1 when killed by a signal
  int signal = 0;  // the signal that killed it, or 0
  bool exitedWith(int expected) const { return signal == 0 && code == expected; }
};

// A child process with stdout and stderr captured to files.
class Child {
public:
  // Starts argv[0] with the current environment plus `environment` (which overrides), and with
  // at most `openFileLimit` descriptors when given (soft and hard limit).
  Child(std::vector<std::string> argv, std::map<std::string, std::string> environment = {},
        std::optional<unsigned long> openFileLimit = std::nullopt);
  ~Child();  // kills it (SIGKILL) if still running, and reaps it
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int signal);
  // Waits for exit, killing it with SIGKILL after `timeout`.
  ExitStatus wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  bool running();
  std::string output() const;  // stdout so far
  std::string errors() const;  // stderr so far

private:
  TempDir files_;
  pid_t pid_ = -1;
  std::optional<ExitStatus> status_;
};

// Runs a program to completion.
struct RunResult {
  ExitStatus status;
  std::string output;
  std::string errors;
};
RunResult run(std::vector<std::string> argv, std::map<std::string, std::string> environment = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(60));

// gpuproxyd on the sim backend with its sockets in a private temp dir. Waits until it answers.
// With GPUPROXY_TEST_BACKEND=cuda-on-stub (chainedCudaBackend()), the daemon under test runs its
// cuda backend on gpuproxy's own stub instead, chained to a second daemon on the sim backend
// (which gets the --sim-* options), so that the cuda backend's code runs without a GPU.
class Daemon {
public:
  struct Options {
    int simDevices = 1;
    std::string simMemory = "16GiB";
    std::vector<std::string> extraArguments;
    // RLIMIT_NOFILE (soft and hard) to start it with; nullopt: the test's own.
    std::optional<unsigned long> openFileLimit;
    // The cuda backend on gpuproxy's own stub, chained to a sim daemon (as with
    // GPUPROXY_TEST_BACKEND=cuda-on-stub).
    bool cudaOnStub = false;
  };
  Daemon();
  explicit Daemon(Options options);
  ~Daemon();  // SIGTERM, then waits for a clean exit
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const std::string& socketPath() const { return socket_; }
  const std::string& adminSocketPath() const { return adminSocket_; }
  pid_t pid() const { return process_->pid(); }
  // SIGTERM and wait: the daemon's exit status.
  ExitStatus stop();
  std::string log() const { return process_->errors(); }
  // For failure messages: the daemon's log and, with the chained cuda backend, the upstream sim
  // daemon's after it.
  std::string logs() const {
    return upstream_ ? log() + "\n--- upstream gpuproxyd ---\n" + upstream_->errors() : log();
  }

  // The environment a client needs to reach this daemon through the stub.
  std::map<std::string, std::string> clientEnvironment() const;
  // Runs a program from tests/programs through the stub against this daemon.
  RunResult runClient(const std::string& program, std::vector<std::string> arguments = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  std::unique_ptr<Child> startClient(const std::string& program,
                                     std::vector<std::string> arguments = {}) const;
  // The same, through another of the daemon's sockets (a tenant's), with extra environment.
  RunResult runClientOn(const std::string& socket, const std::string& program,
                        std::vector<std::string> arguments,
                        std::map<std::string, std::string> environment = {}) const;
  std::unique_ptr<Child> startClientOn(const std::string& socket, const std::string& program,
                                       std::vector<std::string> arguments,
                                       std::map<std::string, std::string> environment = {}) const;
  // `gpuproxyctl status --json`, parsed.
  nlohmann::json status() const;
  // Any gpuproxyctl command against this daemon.
  RunResult ctl(std::vector<std::string> arguments) const;
  void signal(int signal) { process_->signal(signal); }

private:
  TempDir directory_;
  std::string socket_;
  std::string adminSocket_;
  std::unique_ptr<Child> upstream_;  // the sim daemon the chained cuda backend forwards to
  std::unique_ptr<Child> process_;
  bool stopped_ = false;
};

// The "<check> <value>" lines the test programs print (tests/programs), by check.
std::map<std::string, std::string> answers(const std::string& output);
// The entry of tenant `name` in a `gpuproxyctl status --json`, or null.
nlohmann::json tenantNamed(const nlohmann::json& status, const std::string& name);
// Whether the daemon under test is the chained cuda backend (ctest's `cuda_on_stub` re-runs of
// integration tests): GPUPROXY_TEST_BACKEND=cuda-on-stub.
bool chainedCudaBackend();
// Whether the test runs with GPUPROXY_TRANSPORT=rpc (ctest's `rpc` re-runs of integration tests).
bool rpcTransport();

// What a process costs the node, from /proc (zeros once it is gone).
struct ProcessUsage {
  std::uint64_t residentBytes = 0;
  std::uint64_t descriptors = 0;
};
ProcessUsage usageOf(pid_t pid);

// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace gpuproxy::testing
