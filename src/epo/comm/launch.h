// Launching ranks: the mpirun/mpiexec command line that works as root on a small machine, with
// one OpenMP thread count per rank, for Open MPI and MPICH alike.
//
// Open MPI refuses to run as root and to start more ranks than cores unless told
// (--allow-run-as-root, --oversubscribe); MPICH's hydra needs neither. Debian's oneDNN uses
// OpenMP, which starts one thread per CPU in every rank unless OMP_NUM_THREADS says otherwise:
// with several ranks on a few cores that oversubscribes, so every rank gets an explicit count.
// Used by `epo launch` (scripts/epo-mpirun), by tests that must watch a whole job from outside
// (exit status, stderr, time), and by the benchmark harness.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epo/comm/mpi_runtime.h"

namespace epo::comm {

struct LaunchOptions {
    int num_ranks = 1;
    std::vector<std::string> command;  // program and its arguments, run on every rank
    // OMP_NUM_THREADS per rank; 0 = keep the caller's OMP_NUM_THREADS if set, else
    // max(1, cores / num_ranks).
    int omp_threads = 0;
    std::string mpiexec;                    // empty = the launcher of the linked MPI library
    std::vector<std::string> mpiexec_args;  // extra launcher flags, e.g. "--bind-to", "none"
    std::string hosts;  // "a:2,b:2" (Open MPI -H, MPICH -hosts); empty: this machine
    std::vector<std::pair<std::string, std::string>> env;  // extra environment of every rank
};

// For ranks started without epo launch (a plain mpirun): "" when the OpenMP threads of this
// host's ranks fit its CPUs, else a warning naming the counts and the fix. Each rank starts
// OMP_NUM_THREADS threads (its first number) or, unset, one per CPU it may run on
// (`allowed_cpus`); `ranks_per_host` of them over `host_cpus` oversubscribe when the product is
// larger and each rank has more than its share, max(1, host_cpus / ranks_per_host) (measured:
// 3.8x slower steps with two unbound ranks of two threads each on two cores). More ranks than
// CPUs at one thread each is the job's own choice and not warned of. `ranks_per_host` 0 (uneven
// hosts) or an unreadable OMP_NUM_THREADS: "".
std::string omp_oversubscription_warning(int ranks_per_host, const char* omp_num_threads,
                                         int allowed_cpus, int host_cpus);
// The same for this process: its OMP_NUM_THREADS, affinity and the machine's online CPUs.
std::string omp_oversubscription_warning(int ranks_per_host);

// kUsage naming OMP_NUM_THREADS when it is set but is no thread count OpenMP can start: not a
// positive integer (or a comma-separated list of them, OpenMP's nesting form), or more than
// kMaxOmpThreads (OpenMP would try to start them all: 99999999999 was reported as "out of
// memory" from deep inside oneDNN). Called before any kernel runs.
inline constexpr long kMaxOmpThreads = 4096;
void check_omp_num_threads(const char* omp_num_threads);

// Raises epo::Error naming the option for bad values (no ranks, no command).
std::vector<std::string> make_launch_command(const LaunchOptions& options, MpiFlavor flavor,
                                             bool as_root, int num_cores);
// Same, for the linked MPI library, the current user and this machine's cores.
std::vector<std::string> make_launch_command(const LaunchOptions& options);

struct LaunchResult {
    int exit_status = -1;  // the launcher's exit status; 128 + signal if it was killed
    bool timed_out = false;
    double elapsed_s = 0;
    std::string stdout_text;
    std::string stderr_text;
};

// Runs the command, capturing its output; past `timeout_s` the launcher, its process group and
// every process it started (Open MPI puts each local rank in a group of its own) are ended
// (SIGTERM, then SIGKILL 2 s later) and timed_out is set.
LaunchResult run_launch(const std::vector<std::string>& argv, double timeout_s);

// Runs the command for `epo launch` / `epo bench` and returns its exit status (128 + signal when
// it was killed): its stdout is this process's, its stderr goes through is_launcher_noise(), and
// SIGTERM / SIGINT / SIGHUP sent to this process are passed on to it (mpirun passes them to the
// ranks). Once a rank has reported its failure ("epo: rank R of N failed: ..."), the launcher
// gets `failure_grace_s` to end the job; one still running then is stopped (SIGKILL: mpirun
// answers SIGTERM in that state with a segmentation fault) with a message: after an MPI_Abort, Open
// MPI's mpirun can wait for good on the daemon of a host that stopped answering. Raises epo::Error
// if it cannot be started.
//
// A job can also end without any rank saying why: a rank killed (SIGKILL, the out-of-memory
// killer), or a whole host gone (its processes killed, powered off). Then the launcher's status is
// non-zero and no "epo: rank R of N failed" line came; this prints one line saying so, with the
// hosts Open MPI reported it lost its connection to ("Peer host: H") and, when `rank_hosts` (the
// host of each rank, rank_hosts()) is given, the ranks that were on them.
inline constexpr double kLauncherFailureGraceS = 30;
int run_launch_forwarding(const std::vector<std::string>& argv,
                          double failure_grace_s = kLauncherFailureGraceS,
                          const std::vector<std::string>& rank_hosts = {});

// The signal the last run_launch_forwarding() passed on to its launcher (SIGTERM, SIGINT,
// SIGHUP), or 0: the job then ended because the user stopped it.
int forwarded_signal();

// The host of each of `num_ranks` ranks for a `--hosts` list ("a:2,b:2"; a host without ":n" has
// one slot), as Open MPI and MPICH place ranks by default: each host's slots filled in order.
// Empty when it cannot be known: no hosts given, or fewer slots than ranks (oversubscribed).
std::vector<std::string> rank_hosts(const std::string& hosts, int num_ranks);

// The line run_launch_forwarding prints for a job that ended with `status` and no rank's message:
// which hosts were lost (`lost_hosts`, from the launcher's output) and the ranks on them.
std::string silent_failure_message(int status, const std::vector<std::string>& lost_hosts,
                                   const std::vector<std::string>& rank_hosts);

// Lines of the launcher's own diagnostics that mean nothing to a user and drown the rank's
// message: Open MPI's "[host:pid] [[job,0],0] ORTE_ERROR_LOG: ... in file ... at line N" (printed
// while it tears a failed job down) and its other source-location lines. Ranks' lines pass.
bool is_launcher_noise(std::string_view line);

}  // namespace epo::comm
