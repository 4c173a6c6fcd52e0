#include "epo/checkpoint/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

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

void on_stop_signal(int signal) {
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
        default:
            return "signal";
    }
}

StopSignals::StopSignals(int rank, int world_size) {
    EPO_CHECK(!g_installed.exchange(true), "only one StopSignals may exist at a time");
    for (int signal : {SIGTERM, SIGINT}) {
        std::snprintf(g_first_message[slot(signal)], sizeof g_first_message[0],
                      "epo: rank %d of %d received %s: stopping after the current step (the ranks "
                      "agree, save a checkpoint if checkpoint.save is set, and exit 0); send it "
                      "again to exit at once without saving\n",
                      rank, world_size, signal_name(signal));
        std::snprintf(g_second_message[slot(signal)], sizeof g_second_message[0],
                      "epo: rank %d of %d received a second %s: exiting at once without saving\n",
                      rank, world_size, signal_name(signal));
    }
    clear_stop_request();
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
