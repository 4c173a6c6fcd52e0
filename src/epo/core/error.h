// The project's one exception type and the check family that raises it.
//
// Every failure the library reports is an epo::Error: a category (what kind of failure, which
// decides the command line's exit status), a message written for the user (naming the field,
// the value and the fix where there is one), and the source location of the check. Library
// code never calls exit(); the command line and the rank runner turn errors into exit codes and,
// under MPI, into a job-wide abort with the rank and the message.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace epo {

enum class ErrorKind {
    kUsage,     // bad command line, unknown key or recipe, wrong type, malformed file (exit 2)
    kConfig,    // a configuration that parses but violates a rule (exit 1)
    kIo,        // files: missing, unreadable, truncated, corrupt
    kComm,      // MPI failures, timeouts, a peer that died
    kNumerics,  // NaN/Inf and similar
    kCompute,   // a node's own work failed (no peer involved), e.g. EPO_INJECT_FAILURE
    kInternal,  // a broken invariant inside the library (a bug)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& message,
          std::source_location where = std::source_location::current());

    ErrorKind kind() const { return kind_; }
    // "file:line" of the check that raised the error.
    const std::string& where() const { return where_; }

private:
    ErrorKind kind_;
    std::string where_;
};

// Exit status the command line uses for an error of this kind: 2 for usage errors, 1 otherwise.
int exit_status_for(ErrorKind kind);

namespace detail {
[[noreturn]] void check_failed(const char* expr, const std::string& detail,
                               std::source_location where);
}  // namespace detail

}  // namespace epo

// EPO_CHECK(cond, fmt, args...): an internal invariant; failure raises ErrorKind::kInternal with
// the expression text and the formatted detail. EPO_CHECK_EQ/LT/LE print both values.
#define EPO_CHECK(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) [[unlikely]]                                          \
            ::epo::detail::check_failed(#cond, ::fmt::format(__VA_ARGS__), \
                                        std::source_location::current());  \
    } while (0)

#define EPO_CHECK_OP_(a, b, op)                                                    \
    do {                                                                           \
        const auto& epo_a_ = (a);                                                  \
        const auto& epo_b_ = (b);                                                  \
        if (!(epo_a_ op epo_b_)) [[unlikely]]                                      \
            ::epo::detail::check_failed(#a " " #op " " #b,                         \
                                        ::fmt::format("{} vs {}", epo_a_, epo_b_), \
                                        std::source_location::current());          \
    } while (0)

#define EPO_CHECK_EQ(a, b) EPO_CHECK_OP_(a, b, ==)
#define EPO_CHECK_NE(a, b) EPO_CHECK_OP_(a, b, !=)
#define EPO_CHECK_LT(a, b) EPO_CHECK_OP_(a, b, <)
#define EPO_CHECK_LE(a, b) EPO_CHECK_OP_(a, b, <=)
