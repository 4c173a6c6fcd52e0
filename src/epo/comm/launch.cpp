#include "epo/comm/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

std::string omp_oversubscription_warning(int ranks_per_host, const char* omp_num_threads,
                                         int allowed_cpus, int host_cpus) {
    if (ranks_per_host <= 0 || allowed_cpus <= 0 || host_cpus <= 0)
        return "";
    int threads = allowed_cpus;
    std::string why = "OMP_NUM_THREADS unset: one per CPU the rank may run on";
    if (omp_num_threads && *omp_num_threads) {
        char* end = nullptr;
        errno = 0;
        const long n = std::strtol(omp_num_threads, &end, 10);
        if (errno != 0 || end == omp_num_threads || n <= 0 || n > 1'000'000 ||
            (*end != '\0' && *end != ','))
            return "";
        threads = static_cast<int>(n);
        why = fmt::format("OMP_NUM_THREADS={}", omp_num_threads);
    }
    // More ranks than CPUs is the job's own choice; only threads beyond a rank's share are
    // OpenMP's doing (and then threads x ranks exceeds the CPUs), and only those the fix removes.
    const int fair = std::max(1, host_cpus / ranks_per_host);
    if (threads <= fair)
        return "";
    return fmt::format(
        "epo: warning: {} rank(s) on this host each start {} OpenMP thread(s) for oneDNN ({}), "
        "{} threads on {} CPUs: oversubscribed, the products can run several times slower; set "
        "OMP_NUM_THREADS={} for every rank (mpirun -x OMP_NUM_THREADS=...), or start the job with "
        "epo launch, which sets it",
        ranks_per_host, threads, why, static_cast<int64_t>(threads) * ranks_per_host, host_cpus,
        fair);
}

void check_omp_num_threads(const char* value) {
    if (!value || !*value)
        return;
    const std::string text = value;
    bool ok = true;
    for (size_t at = 0; ok && at <= text.size();) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string part = text.substr(at, comma - at);
        ok = !part.empty() && part.size() <= 5 &&
             part.find_first_not_of("0123456789") == std::string::npos && std::stol(part) >= 1 &&
             std::stol(part) <= kMaxOmpThreads;
        at = comma + 1;
    }
    if (!ok) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        throw Error(ErrorKind::kUsage,
                    fmt::format("OMP_NUM_THREADS={}: not a thread count OpenMP can start (give an "
                                "integer from 1 to {}; this host has {} CPUs, and one thread per "
                                "rank is what epo launch sets)",
                                text, kMaxOmpThreads, cpus));
    }
}

std::string omp_oversubscription_warning(int ranks_per_host) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return omp_oversubscription_warning(ranks_per_host, std::getenv("OMP_NUM_THREADS"), allowed,
                                        online > 0 ? static_cast<int>(online) : 0);
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
volatile sig_atomic_t g_forwarded =
    0;  // the signal passed on (0: none): the job's end is the user's

void forward_signal(int signal) {
    g_forwarded = signal;
    if (g_launch_child > 0)
        kill(static_cast<pid_t>(g_launch_child), signal);
}

// The host Open MPI names when it loses one: "  Peer host:  10.77.0.2" in its "peer process has
// unexpectedly disconnected" message, "  Remote daemon: [[61534,0],1] on node 10.77.0.2" in its
// "lost communication with a remote daemon" one.
std::optional<std::string> lost_peer_host(std::string_view line) {
    std::string_view host;
    if (const size_t at = line.find("Peer host:"); at != std::string_view::npos) {
        host = line.substr(at + std::string_view("Peer host:").size());
    } else if (line.find("Remote daemon:") != std::string_view::npos) {
        const size_t on = line.find(" on node ");
        if (on == std::string_view::npos)
            return std::nullopt;
        host = line.substr(on + std::string_view(" on node ").size());
    } else {
        return std::nullopt;
    }
    while (!host.empty() && std::isspace(static_cast<unsigned char>(host.front())))
        host.remove_prefix(1);
    while (!host.empty() && std::isspace(static_cast<unsigned char>(host.back())))
        host.remove_suffix(1);
    if (host.empty())
        return std::nullopt;
    return std::string(host);
}
}  // namespace

std::vector<std::string> rank_hosts(const std::string& hosts, int num_ranks) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < hosts.size() && static_cast<int>(out.size()) < num_ranks) {
        const size_t comma = std::min(hosts.find(',', start), hosts.size());
        const std::string entry = hosts.substr(start, comma - start);
        start = comma + 1;
        const size_t colon = entry.rfind(':');
        int slots = 1;
        if (colon != std::string::npos) {
            const std::string count = entry.substr(colon + 1);
            if (count.empty() || !std::all_of(count.begin(), count.end(), ::isdigit))
                return {};
            slots = std::stoi(count);
        }
        const std::string host = entry.substr(0, colon);
        for (int i = 0; i < slots && static_cast<int>(out.size()) < num_ranks; ++i)
            out.push_back(host);
    }
    if (static_cast<int>(out.size()) < num_ranks)
        return {};
    return out;
}

std::string silent_failure_message(int status, const std::vector<std::string>& lost_hosts,
                                   const std::vector<std::string>& rank_hosts) {
    std::string message = fmt::format(
        "epo launch: the job ended with status {} without any rank reporting a failure: the "
        "launcher itself failed (its message is above), or a rank or a host's daemon died without "
        "a word (killed, out of memory, or its host went down or was cut off)",
        status);
    for (const std::string& host : lost_hosts) {
        std::string ranks;
        for (size_t r = 0; r < rank_hosts.size(); ++r) {
            if (rank_hosts[r] == host)
                ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
        }
        message += fmt::format("; the ranks lost their connection to host {}{}", host,
                               ranks.empty() ? "" : fmt::format(" (rank {})", ranks));
    }
    if (lost_hosts.empty()) {
        // Open MPI does not always say which host it lost ("ORTE was unable to reliably start
        // one or more daemons" is all it prints when a host's daemon dies first): give the
        // placement, so that the host a user knows went down names its ranks.
        message += "; the launcher's messages above may name the host";
        std::string placement;
        for (size_t r = 0; r < rank_hosts.size(); ++r) {
            const bool first_on_host = r == 0 || rank_hosts[r] != rank_hosts[r - 1];
            placement += first_on_host ? fmt::format("{}{}: rank {}", placement.empty() ? "" : "; ",
                                                     rank_hosts[r], r)
                                       : fmt::format(", {}", r);
        }
        if (!placement.empty())
            message += fmt::format(" (ranks by host: {})", placement);
    }
    return message + "\n";
}

int run_launch_forwarding(const std::vector<std::string>& argv, double failure_grace_s,
                          const std::vector<std::string>& rank_hosts) {
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
    g_forwarded = 0;
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
    std::vector<std::string> lost_hosts;  // from the launcher's "Peer host:" lines
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
            if (auto host = lost_peer_host(line);
                host && std::find(lost_hosts.begin(), lost_hosts.end(), *host) == lost_hosts.end())
                lost_hosts.push_back(*host);
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
            // SIGKILL, not SIGTERM: Open MPI's mpirun answers SIGTERM in that state with a
            // segmentation fault and a backtrace that reads as the cause (measured here).
            const std::string message = fmt::format(
                "epo launch: {} was still running {:.0f} s after a rank failed (a host that "
                "stopped answering keeps Open MPI waiting on its daemon); stopping it (SIGKILL)\n",
                argv[0], failure_grace_s);
            (void)!write(STDERR_FILENO, message.data(), message.size());
            kill(pid, SIGKILL);
            terminated_at = Clock::now();
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
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && code != 127 && !failed_at && !g_forwarded) {  // 127: exec failed, said
        const std::string message = silent_failure_message(code, lost_hosts, rank_hosts);
        (void)!write(STDERR_FILENO, message.data(), message.size());
    }
    return code;
}

int forwarded_signal() {
    return g_forwarded;
}

namespace {

// The processes below `root` (children, their children, ...), from /proc. A launcher may put what
// it starts in process groups of their own (Open MPI gives each local rank its own group), so
// ending the launcher's group alone can leave them running.
std::vector<pid_t> process_descendants(pid_t root) {
    std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
        const std::string name = entry.path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
            continue;
        std::ifstream in(entry.path() / "stat");
        std::string stat;
        std::getline(in, stat);
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so from the last ')'.
        const size_t close = stat.rfind(')');
        if (close == std::string::npos)
            continue;
        std::istringstream rest(stat.substr(close + 1));
        std::string state;
        long ppid = 0;
        if (rest >> state >> ppid)
            parent_of.emplace_back(static_cast<pid_t>(std::stol(name)), static_cast<pid_t>(ppid));
    }
    std::vector<pid_t> found;
    std::vector<pid_t> frontier = {root};
    while (!frontier.empty()) {
        const pid_t parent = frontier.back();
        frontier.pop_back();
        for (const auto& [pid, ppid] : parent_of) {
            if (ppid == parent && std::find(found.begin(), found.end(), pid) == found.end()) {
                found.push_back(pid);
                frontier.push_back(pid);
            }
        }
    }
    return found;
}

// Ends the launcher `pid`, its process group and every process below it: SIGTERM, 2 s, SIGKILL.
// The tree is read before the launcher goes, while what it started is still its descendants.
void end_launch_tree(pid_t pid) {
    std::vector<pid_t> tree = process_descendants(pid);
    kill(-pid, SIGTERM);
    for (const pid_t p : tree)
        kill(p, SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    for (const pid_t p : process_descendants(pid)) {
        if (std::find(tree.begin(), tree.end(), p) == tree.end())
            tree.push_back(p);
    }
    kill(-pid, SIGKILL);
    for (const pid_t p : tree)
        kill(p, SIGKILL);
}

}  // namespace

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
            end_launch_tree(pid);
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
