#include "tests/support/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace gpuproxy::testing {

std::string buildDir() {
  const char* dir = std::getenv("GPUPROXY_BUILD_DIR");
  if (dir == nullptr) throw std::runtime_error("GPUPROXY_BUILD_DIR is not set (run under ctest)");
  return dir;
}

namespace {
// The prefix gpuproxyd, gpuproxyctl and the stub are taken from: the build tree's, or with
// GPUPROXY_TEST_INSTALL_ROOT the /usr/local of scripts/package's tarball unpacked there.
std::string shippedPrefix() {
  const char* installRoot = std::getenv("GPUPROXY_TEST_INSTALL_ROOT");
  if (installRoot != nullptr && *installRoot != '\0')
    return std::string(installRoot) + "/usr/local";
  return buildDir();  // the same layout: bin/, lib/gpuproxy/
}
}  // namespace

std::string daemonBinary() {
  return shippedPrefix() + "/bin/gpuproxyd";
}
std::string ctlBinary() {
  return shippedPrefix() + "/bin/gpuproxyctl";
}
std::string stubDirectory() {
  return shippedPrefix() + "/lib/gpuproxy";
}
std::string programBinary(const std::string& name) {
  return buildDir() + "/tests/programs/" + name;
}

TempDir::TempDir() {
  char pattern[] = "/tmp/gpx-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ExitStatus decode(int status) {
  ExitStatus result;
  if (WIFEXITED(status)) result.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

}  // namespace

Child::Child(std::vector<std::string> argv, std::map<std::string, std::string> environment,
             std::optional<unsigned long> openFileLimit) {
  std::string out = files_.file("stdout");
  std::string err = files_.file("stderr");
  const pid_t test = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // A test that dies without its destructors (a sanitizer's abort, a crash) takes the
    // processes it started with it rather than leaving daemons running.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != test) ::_exit(125);  // it died before prctl took effect
    int outFd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int errFd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(outFd, STDOUT_FILENO);
    ::dup2(errFd, STDERR_FILENO);
    for (const auto& [name, value] : environment) ::setenv(name.c_str(), value.c_str(), 1);
    if (openFileLimit) {
      rlimit limit{*openFileLimit, *openFileLimit};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
    }
    std::vector<char*> args;
    for (auto& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed\n", args[0]);
    ::_exit(127);
  }
}

Child::~Child() {
  if (!status_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void Child::signal(int signal) {
  if (!status_) ::kill(pid_, signal);
}

bool Child::running() {
  if (status_) return false;
  int status = 0;
  pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    status_ = decode(status);
    return false;
  }
  return true;
}

ExitStatus Child::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      status_ = decode(status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return *status_;
}

std::string Child::output() const {
  return readFile(files_.file("stdout"));
}
std::string Child::errors() const {
  return readFile(files_.file("stderr"));
}

RunResult run(std::vector<std::string> argv, std::map<std::string, std::string> environment,
              std::chrono::milliseconds timeout) {
  Child child(std::move(argv), std::move(environment));
  ExitStatus status = child.wait(timeout);
  return RunResult{status, child.output(), child.errors()};
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

Daemon::Daemon() : Daemon(Options{}) {}

namespace {

// Starts `argv` and waits until gpuproxyctl gets an answer on `adminSocket`; throws with the
// daemon's log when it does not come.
std::unique_ptr<Child> startDaemon(std::vector<std::string> argv,
                                   std::map<std::string, std::string> environment,
                                   std::optional<unsigned long> openFileLimit,
                                   const std::string& adminSocket) {
  auto process = std::make_unique<Child>(std::move(argv), std::move(environment), openFileLimit);
  bool ready = eventually([&] {
    if (!process->running()) return true;
    return run({ctlBinary(), "--admin-socket", adminSocket, "status", "--json"}, {},
               std::chrono::seconds(10))
        .status.exitedWith(0);
  });
  if (!ready || !process->running()) {
    throw std::runtime_error("gpuproxyd did not start:\n" + process->errors());
  }
  return process;
}

bool isSimArgument(const std::string& argument) {
  return argument.rfind("--sim-", 0) == 0;
}

}  // namespace

Daemon::Daemon(Options options)
    : socket_(directory_.file("gpuproxy.sock")), adminSocket_(directory_.file("admin.sock")) {
  const std::vector<std::string> simulator{"--sim-devices", std::to_string(options.simDevices),
                                           "--sim-memory", options.simMemory};
  std::vector<std::string> argv{daemonBinary(), "--socket",    socket_, "--admin-socket",
                                adminSocket_,   "--log-level", "debug"};
  std::map<std::string, std::string> environment;
  if (!options.cudaOnStub && !chainedCudaBackend()) {
    argv.insert(argv.end(), {"--backend", "sim"});
    argv.insert(argv.end(), simulator.begin(), simulator.end());
    argv.insert(argv.end(), options.extraArguments.begin(), options.extraArguments.end());
  } else {
    // The daemon under test runs its cuda backend on gpuproxy's own stub, which forwards to a
    // sim daemon: the simulator's options (the --sim-* ones) are that daemon's.
    const std::string upstreamSocket = directory_.file("upstream.sock");
    const std::string upstreamAdmin = directory_.file("upstream-admin.sock");
    std::vector<std::string> upstreamArgv{daemonBinary(), "--backend",    "sim",
                                          "--socket",     upstreamSocket, "--admin-socket",
                                          upstreamAdmin};
    upstreamArgv.insert(upstreamArgv.end(), simulator.begin(), simulator.end());
    for (std::size_t i = 0; i < options.extraArguments.size(); ++i) {
      const std::string& argument = options.extraArguments[i];
      const bool forUpstream = isSimArgument(argument);
      (forUpstream ? upstreamArgv : argv).push_back(argument);
      if (argument.find('=') == std::string::npos && i + 1 < options.extraArguments.size() &&
          options.extraArguments[i + 1].rfind("--", 0) != 0) {
        (forUpstream ? upstreamArgv : argv).push_back(options.extraArguments[++i]);
      }
    }
    upstream_ = startDaemon(std::move(upstreamArgv), {}, options.openFileLimit, upstreamAdmin);
    argv.insert(argv.end(),
                {"--backend", "cuda", "--cuda-driver", stubDirectory() + "/libcuda.so.1"});
    environment["GPUPROXY_SOCKET"] = upstreamSocket;
  }
  process_ =
      startDaemon(std::move(argv), std::move(environment), options.openFileLimit, adminSocket_);
}

Daemon::~Daemon() {
  if (!stopped_) stop();
}

ExitStatus Daemon::stop() {
  stopped_ = true;
  process_->signal(SIGTERM);
  ExitStatus status = process_->wait(std::chrono::seconds(30));
  if (upstream_) {
    upstream_->signal(SIGTERM);
    upstream_->wait(std::chrono::seconds(30));
  }
  return status;
}

std::map<std::string, std::string> Daemon::clientEnvironment() const {
  return {{"LD_LIBRARY_PATH", stubDirectory()}, {"GPUPROXY_SOCKET", socket_}};
}

RunResult Daemon::runClient(const std::string& program, std::vector<std::string> arguments,
                            std::chrono::milliseconds timeout) const {
  arguments.insert(arguments.begin(), programBinary(program));
  return run(std::move(arguments), clientEnvironment(), timeout);
}

std::unique_ptr<Child> Daemon::startClient(const std::string& program,
                                           std::vector<std::string> arguments) const {
  arguments.insert(arguments.begin(), programBinary(program));
  return std::make_unique<Child>(std::move(arguments), clientEnvironment());
}

RunResult Daemon::runClientOn(const std::string& socket, const std::string& program,
                              std::vector<std::string> arguments,
                              std::map<std::string, std::string> environment) const {
  arguments.insert(arguments.begin(), programBinary(program));
  environment["LD_LIBRARY_PATH"] = stubDirectory();
  environment["GPUPROXY_SOCKET"] = socket;
  return run(std::move(arguments), std::move(environment));
}

std::unique_ptr<Child> Daemon::startClientOn(const std::string& socket, const std::string& program,
                                             std::vector<std::string> arguments,
                                             std::map<std::string, std::string> environment) const {
  arguments.insert(arguments.begin(), programBinary(program));
  environment["LD_LIBRARY_PATH"] = stubDirectory();
  environment["GPUPROXY_SOCKET"] = socket;
  return std::make_unique<Child>(std::move(arguments), std::move(environment));
}

RunResult Daemon::ctl(std::vector<std::string> arguments) const {
  arguments.insert(arguments.begin(), {ctlBinary(), "--admin-socket", adminSocket_});
  return run(std::move(arguments));
}

nlohmann::json Daemon::status() const {
  RunResult result = run({ctlBinary(), "--admin-socket", adminSocket_, "status", "--json"});
  if (!result.status.exitedWith(0)) {
    throw std::runtime_error("gpuproxyctl status failed: " + result.errors);
  }
  return nlohmann::json::parse(result.output);
}

std::map<std::string, std::string> answers(const std::string& output) {
  std::map<std::string, std::string> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    auto space = line.rfind(' ');
    if (space != std::string::npos) out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

nlohmann::json tenantNamed(const nlohmann::json& status, const std::string& name) {
  for (const auto& tenant : status["tenants"]) {
    if (tenant["name"] == name) return tenant;
  }
  return nullptr;
}

bool chainedCudaBackend() {
  const char* backend = std::getenv("GPUPROXY_TEST_BACKEND");
  return backend != nullptr && std::string(backend) == "cuda-on-stub";
}

bool rpcTransport() {
  const char* transport = std::getenv("GPUPROXY_TRANSPORT");
  return transport != nullptr && std::string(transport) == "rpc";
}

ProcessUsage usageOf(pid_t pid) {
  ProcessUsage usage;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) usage.residentBytes = std::stoull(line.substr(6)) * 1024;
  }
  std::error_code ignored;
  for (auto it =
           std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ignored);
       it != std::filesystem::directory_iterator(); it.increment(ignored)) {
    ++usage.descriptors;
  }
  return usage;
}

}  // namespace gpuproxy::testing
