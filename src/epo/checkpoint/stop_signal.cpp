#include "epo/checkpoint/stop_signal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "epo/comm/rank_runner.h"
#include "epo/core/error.h"
#include "epo/core/stop_flag.h"

namespace epo::checkpoint {
namespace {

// Signal handlers can reach only static storage. Lock-free atomics are async-signal-safe. The
// pending signal itself is the process's stop request (core/stop_flag.h), which the link
// model's hold also watches.
std::atomic<bool> g_installed{false};
char g_first_message[2][320];   // [SIGTERM, SIGINT]
char g_second_message[2][320];  // [SIGTERM, SIGINT]
// After a peer failed (comm/rank_runner.h): the marker it left, and this rank's message then.
char g_failure_marker[256];
// A marker last written before this process installed its handlers is another job's (a reused
// job id), never this job's: its failure would be this job's only if written after the start.
time_t g_marker_not_before = 0;
char g_peer_failed_prefix[2][160];
int g_own_rank = -1;  // this process's world rank (the marker may name it)  // "epo: rank R of N
                      // received SIGTERM: the job is ending ..."

int slot(int signal) {
    return signal == SIGINT ? 1 : 0;
}

void write_all(const char* text) {
    size_t left = std::strlen(text);
    while (left > 0) {
        const ssize_t n = ::write(STDERR_FILENO, text, left);
        if (n <= 0)
            return;
        text += n;
        left -= static_cast<size_t>(n);
    }
}

// The rank that failed first, from its marker ("3\n<its message's first line>\n"), or -1;
// `what` receives the message line (NUL-terminated, possibly empty). open/read/close are
// async-signal-safe.
int failed_peer(char* what, size_t what_size) {
    what[0] = '\0';
    if (g_failure_marker[0] == '\0')
        return -1;
    const int fd = ::open(g_failure_marker, O_RDONLY);
    if (fd < 0)
        return -1;
    struct stat written {};
    if (::fstat(fd, &written) != 0 || written.st_mtime < g_marker_not_before) {
        ::close(fd);
        return -1;
    }
    char text[320] = {};
    ssize_t n = 0;
    for (ssize_t got; n < static_cast<ssize_t>(sizeof text) - 1 &&
                      (got = ::read(fd, text + n, sizeof text - 1 - n)) > 0;)
        n += got;
    ::close(fd);
    int rank = 0;
    bool any = false;
    ssize_t i = 0;
    for (; i < n && text[i] >= '0' && text[i] <= '9'; ++i) {
        rank = rank * 10 + (text[i] - '0');
        any = true;
    }
    if (i < n && text[i] == '\n') {
        size_t k = 0;
        for (++i; i < n && text[i] != '\n' && k + 1 < what_size; ++i)
            what[k++] = text[i];
        what[k] = '\0';
    }
    return any ? rank : -1;
}

void on_stop_signal(int signal) {
    // The launcher tears the job down after a rank failed: saying "stopping after the current
    // step, saving a checkpoint" would promise what cannot happen; say why, and go.
    char what[256];
    if (const int peer = failed_peer(what, sizeof what); peer >= 0) {
        // The rank that failed first said why on its own line; its teardown needs no second.
        if (peer == g_own_rank)
            ::_exit(128 + signal);
        char digits[16];
        int len = 0;
        for (int v = peer; len == 0 || v > 0; v /= 10)
            digits[len++] = static_cast<char>('0' + v % 10);
        char text[24];
        for (int i = 0; i < len; ++i)
            text[i] = digits[len - 1 - i];
        text[len] = '\0';
        write_all(g_peer_failed_prefix[slot(signal)]);
        write_all(text);
        write_all(" failed first");
        if (what[0] != '\0') {
            write_all(" (");
            write_all(what);
            write_all(")");
        }
        write_all("; exiting without saving\n");
        ::_exit(128 + signal);
    }
    if (request_stop(signal)) {
        write_all(g_first_message[slot(signal)]);
        return;
    }
    write_all(g_second_message[slot(signal)]);
    ::_exit(128 + signal);
}

void install(int signal, struct sigaction* previous) {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // MPI's and the file system's calls resume after the handler
    if (sigaction(signal, &action, previous) != 0) {
        throw Error(ErrorKind::kInternal, fmt::format("sigaction({}) failed: {}",
                                                      signal_name(signal), std::strerror(errno)));
    }
}

}  // namespace

const char* signal_name(int signal) {
    switch (signal) {
        case SIGTERM:
            return "SIGTERM";
        case SIGINT:
            return "SIGINT";
        case SIGHUP:
            return "SIGHUP";
        default:
            return "signal";
    }
}

StopSignals::StopSignals(int rank, int world_size) {
    EPO_CHECK(!g_installed.exchange(true), "only one StopSignals may exist at a time");
    for (int signal : {SIGTERM, SIGINT}) {
        std::snprintf(g_first_message[slot(signal)], sizeof g_first_message[0],
                      "epo: rank %d of %d received %s: stopping after the current step (if "
                      "every rank is still running, the ranks agree, save a checkpoint if "
                      "checkpoint.save is set, and exit 0); send it again to exit at once "
                      "without saving\n",
                      rank, world_size, signal_name(signal));
        std::snprintf(g_second_message[slot(signal)], sizeof g_second_message[0],
                      "epo: rank %d of %d received a second %s: exiting at once without saving\n",
                      rank, world_size, signal_name(signal));
    }
    clear_stop_request();
    g_own_rank = rank;
    const std::string marker = comm::job_failure_marker_path();
    // Whole seconds, as st_mtime: one second of slack so that a marker written in the second the
    // job started still counts.
    g_marker_not_before = std::time(nullptr) - 1;
    comm::remove_stale_job_failure_markers();
    std::snprintf(g_failure_marker, sizeof g_failure_marker, "%s",
                  marker.size() < sizeof g_failure_marker ? marker.c_str() : "");
    for (int signal : {SIGTERM, SIGINT}) {
        std::snprintf(g_peer_failed_prefix[slot(signal)], sizeof g_peer_failed_prefix[0],
                      "epo: rank %d of %d received %s: the job is ending because rank ", rank,
                      world_size, signal_name(signal));
    }
    install(SIGTERM, &previous_term_);
    install(SIGINT, &previous_int_);
}

StopSignals::~StopSignals() {
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGINT, &previous_int_, nullptr);
    g_installed.store(false);
}

int StopSignals::pending() const {
    return stop_requested();
}

}  // namespace epo::checkpoint
