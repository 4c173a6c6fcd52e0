// Ending the job when one rank fails, so that no rank is left waiting for it.
//
// Under MPI, a rank that stops (an exception, a timeout) leaves its peers blocked in the next
// collective. The rule here: the first failure on any rank, on any thread, prints
// "epo: rank R of N failed: <kind>: <message>" on stderr and calls MPI_Abort, which ends every
// rank of the job with a non-zero status. The `epo` subcommands and the multi-rank tests run
// their rank body through run_rank(); the stream worker threads and the comm watchdog call
// abort_job() directly.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "epo/comm/mpi_runtime.h"

namespace epo::comm {

// "<kind>: <message>" for an epo::Error ("[at file:line]" added for internal errors only: the
// source location helps a bug report and means nothing to a user), "I/O error: ..." for a file
// system failure, "out of memory: ..." for std::bad_alloc, "internal error: ..." for the rest.
std::string describe_exception(const std::exception_ptr& error);

// Where a failing rank leaves its rank number before it ends the job, so that the ranks torn
// down after it can say why they received SIGTERM (checkpoint/stop_signal.h): a file under /tmp
// named by the launcher's job id (PMIx namespace, Open MPI job id, Slurm job and step); "" when
// the launcher names no job.
//
// A marker outlives its job (the ranks that read it are being torn down), so it is bounded two
// ways: a rank ignores a marker older than its own start (a launcher may reuse a job id after
// its process ids wrap), and every job's start removes the markers older than a day
// (remove_stale_job_failure_markers, from StopSignals).
std::string job_failure_marker_path();

// Leaves this rank's failure in the marker at `path` ("R\n<first line of message>\n") unless a
// rank of this job failed first: the first writer wins, so every rank torn down afterwards blames
// the rank whose failure started the teardown (a stuck collective times out on several ranks
// within moments; the last to write must not take the blame from the first). A marker older than
// this process (another job's, under a reused job id) is replaced. True when this rank's failure
// is the marker's.
bool claim_job_failure_marker(const std::string& path, int rank, const std::string& message);

// Removes /tmp/epo-job-*.failed files last written more than `max_age` ago; returns how many.
// Best effort: a file another job removes first, or one this user may not remove, is skipped.
int remove_stale_job_failure_markers(std::chrono::seconds max_age = std::chrono::hours(24),
                                     const std::string& directory = "/tmp");

// Open MPI's launcher can wait for good after an MPI_Abort when a host stopped answering: it
// queues the kill of that host's processes on a TCP connection the cut link never acknowledges
// (keepalive probes only idle connections, and the kernel retransmits for ~15 minutes), so a
// plain `mpirun` job never ended (3 of 3 tries past 200 s; measured here: mpirun idle in its
// event loop, every rank gone). Before MPI_Abort, a failing rank whose parent is an MPI launcher
// or daemon (mpirun, mpiexec, orterun, orted, prterun, prted) starts a detached watcher: it exits
// as soon as that parent does (every job Open MPI ends by itself, within a second or two), and
// otherwise, after `grace`, writes `message` to the launcher's own stderr and ends it with
// SIGKILL (mpirun answers SIGTERM in that state with a segmentation fault whose backtrace reads
// as the cause). The watcher holds none of the rank's files, so the launcher's output channels
// close as usual.
inline constexpr std::chrono::seconds kLauncherWatchGrace{15};
// Whether a process name (/proc/PID/comm) is an MPI launcher or daemon the watcher may end.
bool is_mpi_launcher_name(std::string_view comm);
// Starts the watcher over `launcher` (a pid; its start time pins it, so a reused pid is never
// signalled). Returns the watcher's pid, or -1 when it could not start. Async-signal-safe in the
// child; the parent returns at once.
int start_launcher_watch(int launcher, std::chrono::milliseconds grace, const std::string& message);

// A rank can also end without abort_job(): Open MPI's own abort path (a transport error ends
// the process inside the library), a signal, the kernel's OOM killer. Then nothing watches its
// launcher, and a daemon on a host whose link was cut stays for good. So every rank of a
// multi-rank job whose parent is an MPI launcher or daemon starts, right after MPI is up, a
// guardian: a detached process (its own session, none of the rank's files) holding the read end
// of a pipe whose write end only the rank holds. When the rank finishes its run it writes so
// (release_rank_guardian) and the guardian leaves; when the pipe reaches its end without that
// (the rank is gone, whatever ended it), the guardian watches the launcher as above: gone within
// `grace`, nothing happens; otherwise `message` on its stderr and SIGKILL. With a guardian,
// abort_job() starts no watcher of its own. Returns the guardian's pid, or -1 (not started, or
// one is already running).
int start_rank_guardian(int launcher, std::chrono::milliseconds grace, const std::string& message);
// Tells the guardian the run finished (it leaves without watching). Idempotent.
void release_rank_guardian();
bool rank_guardian_started();
// The guardian over this rank's parent, when the parent is an MPI launcher or daemon.
void guard_rank_under_launcher(int rank, int size);

// Prints "epo: rank R of N failed: <message>" and ends the whole job (MPI_Abort with
// `exit_status`; without MPI, the process exits with it). The first caller wins: a second
// failure on another thread while the job is going down is printed but changes nothing.
[[noreturn]] void abort_job(const std::string& message, int exit_status = 1);

// abort_job() with the exception's description and its exit status (2 usage, 1 otherwise).
[[noreturn]] void abort_job(const std::exception_ptr& error);

// Runs `call`, a blocking MPI call outside any Communicator (the start-up agreements on the run
// directory and --out, the end-of-run gathers of traces and checksums), under a deadline: if it
// has not returned after `timeout_s` (comm.timeout_s), a watchdog ends the job through
// abort_job() with `what` and the limit named. Such a call cannot fail by itself when a peer
// stops answering; this is what bounds it, as the Communicator's watchdog bounds its data phases.
void watched_world_call(const std::string& what, double timeout_s,
                        const std::function<void()>& call);
// comm.timeout_s's default, the bound of start-up calls made before the configuration is read.
inline constexpr double kDefaultCommTimeoutS = 300;

// Runs this rank's body; any exception ends the job through abort_job(). Returns 0.
int run_rank(const std::function<void()>& body);

// A complete rank main: starts MPI (MpiRuntime, EP005 checked), runs `body` under run_rank()
// semantics, finalizes MPI. Returns the process exit status (0).
int run_mpi_main(int* argc, char*** argv, const std::function<void(MpiRuntime&)>& body);

}  // namespace epo::comm
