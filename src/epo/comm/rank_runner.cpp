#include "epo/comm/rank_runner.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <new>
#include <thread>

#include "epo/comm/watchdog.h"
#include "epo/core/error.h"

namespace epo::comm {
namespace {

// When this process started (to the second, as st_mtime): a failure marker last written before
// it belongs to another job.
const std::time_t kProcessStart = std::time(nullptr);

}  // namespace

std::string describe_exception(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::kInternal)
            return fmt::format("{}: {} [at {}]", error_kind_name(e.kind()), e.what(), e.where());
        return fmt::format("{}: {}", error_kind_name(e.kind()), e.what());
    } catch (const std::filesystem::filesystem_error& e) {
        return fmt::format("{}: {}", error_kind_name(ErrorKind::kIo), e.what());
    } catch (const std::bad_alloc&) {
        return "out of memory: an allocation failed; the run needs more memory than this "
               "machine gives it (epo validate prints the estimate)";
    } catch (const std::exception& e) {
        return fmt::format("internal error: {}", e.what());
    } catch (...) {
        return "internal error: unknown exception";
    }
}

std::string job_failure_marker_path() {
    std::string id;
    for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"}) {
        if (const char* value = std::getenv(v); value && *value) {
            id = value;
            if (const char* step = std::getenv("SLURM_STEP_ID"); step && v[0] == 'S')
                id += std::string(".") + step;
            break;
        }
    }
    if (id.empty())
        return "";
    for (char& c : id) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-')
            c = '_';
    }
    return "/tmp/epo-job-" + id + ".failed";
}

int remove_stale_job_failure_markers(std::chrono::seconds max_age, const std::string& directory) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto cutoff = fs::file_time_type::clock::now() - max_age;
    int removed = 0;
    for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.starts_with("epo-job-") || !name.ends_with(".failed"))
            continue;
        std::error_code file_ec;
        const auto written = fs::last_write_time(it->path(), file_ec);
        if (!file_ec && written < cutoff && fs::remove(it->path(), file_ec) && !file_ec)
            ++removed;
    }
    return removed;
}

namespace {

// Field 22 of /proc/PID/stat (the start time in clock ticks), or 0 when the process is gone.
// Only open/read/close and arithmetic: safe in a forked child of a multi-threaded process.
unsigned long long process_start_time(int pid) {
    char path[64] = "/proc/";
    int at = 6;
    char digits[16];
    int n = 0;
    for (int v = pid; n == 0 || v > 0; v /= 10)
        digits[n++] = static_cast<char>('0' + v % 10);
    while (n > 0)
        path[at++] = digits[--n];
    const char tail[] = "/stat";
    for (const char c : tail)
        path[at++] = c;
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char text[1024];
    const ssize_t got = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (got <= 0)
        return 0;
    text[got] = '\0';
    // The name (field 2) may hold spaces: count fields after its last closing parenthesis.
    ssize_t i = got - 1;
    while (i > 0 && text[i] != ')')
        --i;
    if (i + 2 < got && text[i + 2] == 'Z')
        return 0;  // a zombie has ended; only its parent has not reaped it yet
    int field = 2;
    unsigned long long value = 0;
    for (++i; i < got; ++i) {
        if (text[i] == ' ') {
            if (++field > 22)
                break;
        } else if (field == 22 && text[i] >= '0' && text[i] <= '9') {
            value = value * 10 + static_cast<unsigned>(text[i] - '0');
        }
    }
    return value;
}

void sleep_ms(long ms) {
    timespec t{ms / 1000, (ms % 1000) * 1000000L};
    while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

}  // namespace

bool is_mpi_launcher_name(std::string_view comm) {
    // Debian installs the launchers under suffixed names too ("mpirun.openmpi", "mpiexec.hydra",
    // "mpiexec.mpich"), which epo launch runs by their resolved path.
    for (const std::string_view name :
         {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "hydra_pmi_proxy"}) {
        if (comm == name ||
            (comm.starts_with(name) && comm.size() > name.size() && comm[name.size()] == '.'))
            return true;
    }
    return false;
}

namespace {

// The watch itself, in a forked child that has left the rank's session and files: waits up to
// `grace` for the launcher (pinned by its start time) to end, then says why on its stderr and
// ends it with SIGKILL. Only system calls; never returns.
[[noreturn]] void watch_launcher(int launcher, unsigned long long started,
                                 std::chrono::milliseconds grace, const std::string& stderr_path,
                                 const std::string& line) {
    const auto alive = [&] { return process_start_time(launcher) == started; };
    for (long waited = 0; waited < grace.count(); waited += 100) {
        if (!alive())
            ::_exit(0);
        sleep_ms(100);
    }
    if (!alive())
        ::_exit(0);
    // Said where the launcher's own errors go (its stderr, not the ranks' pipes), then SIGKILL:
    // Open MPI's mpirun answers SIGTERM in that state with a segmentation fault and a backtrace
    // that reads as the cause (measured here). The launcher's own descriptor is borrowed
    // (pidfd_getfd: its offset too, so a shell's next line into the same file does not overwrite
    // this one); where the kernel refuses, its path is opened for appending.
    int fd = -1;
    if (const long pidfd = ::syscall(SYS_pidfd_open, launcher, 0); pidfd >= 0) {
        fd = static_cast<int>(::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), 2, 0));
        ::close(static_cast<int>(pidfd));
    }
    if (fd < 0)
        fd = ::open(stderr_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) {
        (void)!::write(fd, line.data(), line.size());
        ::close(fd);
    }
    ::kill(launcher, SIGKILL);
    ::_exit(0);
}

// The guardian's write end (rank side), -1 when none was started.
std::atomic<int> guardian_fd{-1};

// This process's parent's name (/proc/PPID/comm), "" when it cannot be read.
std::string parent_process_name() {
    char comm[64] = "";
    if (FILE* f = std::fopen(fmt::format("/proc/{}/comm", ::getppid()).c_str(), "r")) {
        if (std::fgets(comm, sizeof comm, f))
            comm[std::strcspn(comm, "\n")] = '\0';
        std::fclose(f);
    }
    return comm;
}

}  // namespace

int start_launcher_watch(int launcher, std::chrono::milliseconds grace,
                         const std::string& message) {
    const unsigned long long started = process_start_time(launcher);
    if (launcher <= 1 || started == 0)
        return -1;
    // Everything the child needs, prepared here: after fork() it may only make system calls.
    const std::string stderr_path = fmt::format("/proc/{}/fd/2", launcher);
    const std::string line = message + "\n";
    const pid_t pid = ::fork();
    if (pid != 0)
        return pid < 0 ? -1 : static_cast<int>(pid);
    // The watcher: its own session (the job's signals to the rank's group miss it), none of the
    // rank's files (the launcher's output pipes must close when the ranks end).
    ::setsid();
    for (int fd = 0; fd < 1024; ++fd)
        ::close(fd);
    watch_launcher(launcher, started, grace, stderr_path, line);
}

int start_rank_guardian(int launcher, std::chrono::milliseconds grace, const std::string& message) {
    const unsigned long long started = process_start_time(launcher);
    if (launcher <= 1 || started == 0 || guardian_fd.load() >= 0)
        return -1;
    int ends[2];
    // Close-on-exec: a program the rank runs must not keep the rank "alive" for the guardian.
    if (::pipe2(ends, O_CLOEXEC) != 0)
        return -1;
    const std::string stderr_path = fmt::format("/proc/{}/fd/2", launcher);
    const std::string line = message + "\n";
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(ends[0]);
        ::close(ends[1]);
        return -1;
    }
    if (pid != 0) {
        ::close(ends[0]);
        guardian_fd.store(ends[1]);
        return static_cast<int>(pid);
    }
    // The guardian: its own session, no file of the rank's but the pipe's read end, a name of
    // its own (it shares the rank's command line and environment: `pgrep -x epo` and tools
    // that find ranks by their environment must skip "epo-guardian"), and deaf to the signals
    // users and launchers send a job (a stray one must not end it before the rank).
    ::setsid();
    ::prctl(PR_SET_NAME, "epo-guardian", 0, 0, 0);
    for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGQUIT})
        ::signal(sig, SIG_IGN);
    for (int fd = 0; fd < 1024; ++fd) {
        if (fd != ends[0])
            ::close(fd);
    }
    char c = 0;
    ssize_t got;
    do {
        got = ::read(ends[0], &c, 1);
    } while (got < 0 && errno == EINTR);
    if (got == 1 && c == 'F')
        ::_exit(0);  // the rank finished its run: nothing to watch
    // End of file: the rank is gone without finishing (any way: an abort, a signal, MPI's own
    // abort path); its launcher must not outlive it for good.
    watch_launcher(launcher, started, grace, stderr_path, line);
}

void release_rank_guardian() {
    const int fd = guardian_fd.exchange(-1);
    if (fd < 0)
        return;
    const char finished = 'F';
    (void)!::write(fd, &finished, 1);
    ::close(fd);
}

bool rank_guardian_started() {
    return guardian_fd.load() >= 0;
}

bool claim_job_failure_marker(const std::string& path, int rank, const std::string& message) {
    // Written whole under a name of this process's own, then linked into place: link() fails
    // when the marker exists, so the first rank to fail owns it and no reader sees half a file.
    const std::string own = fmt::format("{}.{}", path, ::getpid());
    const std::string first_line = message.substr(0, message.find('\n'));
    {
        FILE* f = std::fopen(own.c_str(), "w");
        if (!f)
            return false;
        std::fprintf(f, "%d\n%.200s\n", rank, first_line.c_str());
        if (std::fclose(f) != 0) {
            std::remove(own.c_str());
            return false;
        }
    }
    bool claimed = ::link(own.c_str(), path.c_str()) == 0;
    if (!claimed && errno == EEXIST) {
        // A marker older than this process is another job's (a reused job id): replace it once.
        struct stat existing {};
        if (::stat(path.c_str(), &existing) == 0 && existing.st_mtime < kProcessStart - 1 &&
            std::remove(path.c_str()) == 0)
            claimed = ::link(own.c_str(), path.c_str()) == 0;
    }
    std::remove(own.c_str());
    return claimed;
}

void abort_job(const std::string& message, int exit_status) {
    static std::atomic<bool> aborting{false};
    const int rank = current_world_rank();
    const int size = current_world_size();
    std::fprintf(stderr, "epo: rank %d of %d failed: %s\n", rank, size, message.c_str());
    std::fflush(stderr);
    if (aborting.exchange(true)) {
        // Another thread is already ending the job; wait for it to take this process down.
        for (;;)
            std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    // Before MPI_Abort: the launcher's SIGTERM to the other ranks follows it.
    if (const std::string marker = job_failure_marker_path(); !marker.empty() && size > 1)
        claim_job_failure_marker(marker, rank, message);
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        // Only under a launcher that can hang on a silent host (rank_runner.h).
        if (size > 1) {
            const std::string comm = parent_process_name();
            if (is_mpi_launcher_name(comm) && !rank_guardian_started()) {
                start_launcher_watch(
                    ::getppid(), kLauncherWatchGrace,
                    fmt::format("epo: {} (pid {}) was still running {} s after rank {} of {} "
                                "failed and ended the job (Open MPI waits for good on the daemon "
                                "of a host that stopped answering); rank {} ended it (SIGKILL): "
                                "the job failed, see rank {}'s message above",
                                comm, ::getppid(), kLauncherWatchGrace.count(), rank, size, rank,
                                rank));
            }
        }
        MPI_Abort(MPI_COMM_WORLD, exit_status);
    }
    // Without MPI (or if MPI_Abort returned), end this process: nothing else can be trusted.
    _exit(exit_status);
}

void abort_job(const std::exception_ptr& error) {
    int status = 1;
    try {
        std::rethrow_exception(error);
    } catch (const Error& e) {
        status = exit_status_for(e.kind());
    } catch (...) {
    }
    abort_job(describe_exception(error), status);
}

void watched_world_call(const std::string& what, double timeout_s,
                        const std::function<void()>& call) {
    // One watchdog thread for every such call of the process, started by the first.
    static Watchdog watchdog;
    const auto limit = std::chrono::duration<double>(timeout_s);
    auto guard = watchdog.watch(
        fmt::format("{}: the other ranks did not all arrive within comm.timeout_s = {:g} s (a rank "
                    "stopped, or its host stopped answering); ending the job",
                    what, timeout_s),
        Clock::now() + std::chrono::duration_cast<Clock::duration>(limit));
    call();
}

void guard_rank_under_launcher(int rank, int size) {
    const std::string comm = parent_process_name();
    if (!is_mpi_launcher_name(comm))
        return;
    start_rank_guardian(
        ::getppid(), kLauncherWatchGrace,
        fmt::format("epo: {} (pid {}) was still running {} s after rank {} of {} ended without "
                    "finishing its run (Open MPI waits for good on the daemon of a host that "
                    "stopped answering); the rank's guardian ended it (SIGKILL): the job failed, "
                    "see the first rank's message above",
                    comm, ::getppid(), kLauncherWatchGrace.count(), rank, size));
}

int run_rank(const std::function<void()>& body) {
    try {
        body();
    } catch (...) {
        abort_job(std::current_exception());
    }
    return 0;
}

int run_mpi_main(int* argc, char*** argv, const std::function<void(MpiRuntime&)>& body) {
    // MpiRuntime is built inside the guard so that an EP005 refusal also ends the job cleanly.
    return run_rank([&] {
        MpiRuntime mpi(argc, argv);
        body(mpi);
    });
}

}  // namespace epo::comm
