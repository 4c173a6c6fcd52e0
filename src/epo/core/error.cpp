#include "epo/core/error.h"

#include <filesystem>

namespace epo {

const char* error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::kUsage:
            return "usage error";
        case ErrorKind::kConfig:
            return "configuration error";
        case ErrorKind::kIo:
            return "I/O error";
        case ErrorKind::kComm:
            return "communication error";
        case ErrorKind::kNumerics:
            return "numerical error";
        case ErrorKind::kCompute:
            return "compute failure";
        case ErrorKind::kInternal:
            return "internal error";
    }
    return "error";
}

Error::Error(ErrorKind kind, const std::string& message, std::source_location where)
    : std::runtime_error(message),
      kind_(kind),
      where_(fmt::format("{}:{}", std::filesystem::path(where.file_name()).filename().string(),
                         where.line())) {}

int exit_status_for(ErrorKind kind) {
    return kind == ErrorKind::kUsage ? 2 : 1;
}

namespace detail {
void check_failed(const char* expr, const std::string& detail, std::source_location where) {
    throw Error(ErrorKind::kInternal,
                detail.empty() ? fmt::format("check failed: {}", expr)
                               : fmt::format("check failed: {} ({})", expr, detail),
                where);
}
}  // namespace detail

}  // namespace epo
