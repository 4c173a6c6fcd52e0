#include "epo/comm/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>

#include "epo/core/error.h"

namespace epo::comm {

namespace {

bool on_path(const std::string& program) {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0)
            return true;
    }
    return false;
}

std::string default_launcher(MpiFlavor flavor) {
    // Debian installs both libraries side by side; the suffixed names pick the right one
    // whatever the `mpirun` alternative points to.
    if (flavor == MpiFlavor::kOpenMpi && on_path("mpirun.openmpi"))
        return "mpirun.openmpi";
    if (flavor == MpiFlavor::kOpenMpi)
        return "mpirun";
    if (flavor == MpiFlavor::kMpich && on_path("mpiexec.mpich"))
        return "mpiexec.mpich";
    return "mpiexec";
}

}  // namespace

std::vector<std::string> make_launch_command(const LaunchOptions& options, MpiFlavor flavor,
                                             bool as_root, int num_cores) {
    if (options.num_ranks < 1) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("number of ranks {} is not positive: pass -n 1 or more",
                                options.num_ranks));
    }
    if (options.command.empty()) {
        throw Error(ErrorKind::kUsage, "no command to launch: name the program to run per rank");
    }
    if (options.omp_threads < 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("--omp-threads {} is negative: pass 0 (automatic) or a count",
                                options.omp_threads));
    }
    std::vector<std::string> argv{options.mpiexec.empty() ? default_launcher(flavor)
                                                          : options.mpiexec};
    if (flavor == MpiFlavor::kOpenMpi) {
        if (as_root)
            argv.push_back("--allow-run-as-root");
        argv.push_back("--oversubscribe");
    }
    argv.insert(argv.end(), {"-np", std::to_string(options.num_ranks)});
    if (!options.hosts.empty()) {
        argv.insert(argv.end(), {flavor == MpiFlavor::kOpenMpi ? "-H" : "-hosts", options.hosts});
    }
    argv.insert(argv.end(), options.mpiexec_args.begin(), options.mpiexec_args.end());

    auto env = options.env;
    std::string omp;
    if (options.omp_threads > 0) {
        omp = std::to_string(options.omp_threads);
    } else if (const char* given = std::getenv("OMP_NUM_THREADS"); given && *given) {
        omp = given;
    } else {
        omp = std::to_string(std::max(1, num_cores / options.num_ranks));
    }
    env.emplace_back("OMP_NUM_THREADS", omp);
    for (const auto& [name, value] : env) {
        if (flavor == MpiFlavor::kOpenMpi) {
            argv.insert(argv.end(), {"-x", name + "=" + value});
        } else {
            argv.insert(argv.end(), {"-genv", name, value});
        }
    }
    argv.insert(argv.end(), options.command.begin(), options.command.end());
    return argv;
}

std::vector<std::string> make_launch_command(const LaunchOptions& options) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return make_launch_command(options, mpi_flavor(), geteuid() == 0,
                               cores > 0 ? static_cast<int>(cores) : 1);
}

namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
    std::vector<char*> out;
    for (const auto& a : argv)
        out.push_back(const_cast<char*>(a.c_str()));
    out.push_back(nullptr);
    return out;
}

}  // namespace

bool is_launcher_noise(std::string_view line) {
    // "[host:12345] [[4242,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in
    // file util/show_help.c at line 507"; also PMIx's "... in file ... at line ..." lines.
    if (line.find("ORTE_ERROR_LOG") != std::string_view::npos ||
        line.find("PMIX ERROR") != std::string_view::npos)
        return true;
    return line.rfind("[", 0) == 0 && line.find("] [[") != std::string_view::npos &&
           line.find(" in file ") != std::string_view::npos &&
           line.find(" at line ") != std::string_view::npos;
}

namespace {
// The child the signal handler passes signals on to. Process-wide by nature (a signal is); set
// once before the handlers are installed.
volatile sig_atomic_t g_launch_child = 0;

void forward_signal(int signal) {
    if (g_launch_child > 0)
        kill(static_cast<pid_t>(g_launch_child), signal);
}
}  // namespace

int run_launch_forwarding(const std::vector<std::string>& argv, double failure_grace_s) {
    EPO_CHECK(!argv.empty(), "empty launch command");
    int err_pipe[2];
    if (pipe2(err_pipe, O_CLOEXEC) != 0)
        throw Error(ErrorKind::kIo, fmt::format("pipe: {}", std::strerror(errno)));
    auto args = c_argv(argv);
    const pid_t pid = fork();
    if (pid < 0)
        throw Error(ErrorKind::kIo, fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
        dup2(err_pipe[1], STDERR_FILENO);
        execvp(args[0], args.data());
        const std::string message = fmt::format(
            "epo: usage error: cannot run {}: {}; install Open MPI (openmpi-bin) or "
            "MPICH (mpich), or name the launcher with --mpiexec\n",
            argv[0], std::strerror(errno));
        (void)!write(STDERR_FILENO, message.data(), message.size());
        _exit(127);
    }
    close(err_pipe[1]);
    g_launch_child = pid;
    struct sigaction action {};
    action.sa_handler = forward_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    const int kForwarded[] = {SIGTERM, SIGINT, SIGHUP};
    struct sigaction previous[3]{};
    for (int i = 0; i < 3; ++i)
        sigaction(kForwarded[i], &action, &previous[i]);
    // Line by line, so a rank's message is never cut by a filtered line around it. The pipe is
    // polled, so the launcher's exit is seen even while a rank it left behind holds the pipe.
    std::string pending;
    char buf[4096];
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> failed_at, terminated_at;
    int status = 0;
    bool exited = false;
    // Reads what the pipe holds within `wait_ms`; false at its end (every writer gone).
    const auto read_some = [&](int wait_ms) {
        pollfd p{err_pipe[0], POLLIN, 0};
        if (poll(&p, 1, wait_ms) <= 0)
            return true;
        const ssize_t n = read(err_pipe[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            return true;
        if (n <= 0)
            return false;
        pending.append(buf, static_cast<size_t>(n));
        size_t start = 0;
        for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
            const std::string_view line(pending.data() + start, nl - start);
            if (!failed_at && line.find("epo: rank ") != std::string_view::npos &&
                line.find(" failed: ") != std::string_view::npos)
                failed_at = Clock::now();
            if (!is_launcher_noise(line)) {
                (void)!write(STDERR_FILENO, line.data(), line.size());
                (void)!write(STDERR_FILENO, "\n", 1);
            }
        }
        pending.erase(0, start);
        return true;
    };
    for (bool open = true; !exited;) {
        if (open) {
            open = read_some(500);
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        const pid_t done = waitpid(pid, &status, WNOHANG);
        exited = done == pid;
        if (exited || !failed_at)
            continue;
        const double since = std::chrono::duration<double>(Clock::now() - *failed_at).count();
        if (!terminated_at && since > failure_grace_s) {
            const std::string message = fmt::format(
                "epo launch: {} was still running {:.0f} s after a rank failed (a host that "
                "stopped answering keeps Open MPI waiting on its daemon); stopping it\n",
                argv[0], failure_grace_s);
            (void)!write(STDERR_FILENO, message.data(), message.size());
            kill(pid, SIGTERM);
            terminated_at = Clock::now();
        } else if (terminated_at &&
                   std::chrono::duration<double>(Clock::now() - *terminated_at).count() > 5) {
            kill(pid, SIGKILL);
        }
    }
    // What the launcher wrote just before it ended (a rank it left behind may keep the pipe open,
    // so only what is there now).
    for (int i = 0; i < 1000; ++i) {
        pollfd p{err_pipe[0], POLLIN, 0};
        if (poll(&p, 1, 0) <= 0 || !read_some(0))
            break;
    }
    if (!pending.empty() && !is_launcher_noise(pending))
        (void)!write(STDERR_FILENO, pending.data(), pending.size());
    close(err_pipe[0]);
    // The pid may be reused from here on: nothing may be forwarded to it any more.
    for (int i = 0; i < 3; ++i)
        sigaction(kForwarded[i], &previous[i], nullptr);
    g_launch_child = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

LaunchResult run_launch(const std::vector<std::string>& argv, double timeout_s) {
    EPO_CHECK(!argv.empty(), "empty launch command");
    int out_pipe[2];
    int err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
        throw Error(ErrorKind::kIo, fmt::format("pipe: {}", std::strerror(errno)));
    }
    auto args = c_argv(argv);
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid < 0)
        throw Error(ErrorKind::kIo, fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
        // Child: own process group, so a timeout can end the launcher and all it started.
        setpgid(0, 0);
        dup2(out_pipe[1], STDOUT_FILENO);
        dup2(err_pipe[1], STDERR_FILENO);
        execvp(args[0], args.data());
        const std::string msg = fmt::format("cannot run {}: {}\n", argv[0], std::strerror(errno));
        (void)!write(STDERR_FILENO, msg.data(), msg.size());
        _exit(127);
    }
    setpgid(pid, pid);
    close(out_pipe[1]);
    close(err_pipe[1]);

    LaunchResult result;
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    std::string* sinks[2] = {&result.stdout_text, &result.stderr_text};
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(timeout_s));
    int open_fds = 2;
    while (open_fds > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            result.timed_out = true;
            kill(-pid, SIGTERM);
            std::this_thread::sleep_for(std::chrono::seconds(2));
            kill(-pid, SIGKILL);
            break;
        }
        if (poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR) {
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            const ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                sinks[i]->append(buf, static_cast<size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                --open_fds;
            }
        }
    }
    for (auto& fd : fds) {
        if (fd.fd >= 0)
            close(fd.fd);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result;
}

}  // namespace epo::comm
