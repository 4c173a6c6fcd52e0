#include "epo/io/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "epo/core/error.h"

namespace epo::io {
namespace fs = std::filesystem;
namespace {

std::string kind_of(const fs::file_status& s) {
    switch (s.type()) {
        case fs::file_type::directory:
            return "a directory";
        case fs::file_type::fifo:
            return "a FIFO (named pipe)";
        case fs::file_type::character:
        case fs::file_type::block:
            return "a device";
        case fs::file_type::socket:
            return "a socket";
        default:
            return "not a regular file";
    }
}

}  // namespace

void require_regular_file(const fs::path& path, std::string_view what) {
    std::error_code ec;
    const fs::file_status s = fs::status(path, ec);
    if (!fs::exists(s)) {
        throw Error(ErrorKind::kUsage, fmt::format("{} {}: no such file", what, path.string()));
    }
    if (!fs::is_regular_file(s)) {
        throw Error(ErrorKind::kUsage, fmt::format("{} {}: it is {}; give a regular file", what,
                                                   path.string(), kind_of(s)));
    }
    if (::access(path.c_str(), R_OK) != 0) {
        throw Error(ErrorKind::kUsage, fmt::format("{} {}: cannot read it ({})", what,
                                                   path.string(), std::strerror(errno)));
    }
}

void require_writable_file(const fs::path& path, std::string_view what) {
    std::error_code ec;
    const fs::file_status s = fs::status(path, ec);
    if (fs::exists(s) && !fs::is_regular_file(s)) {
        throw Error(ErrorKind::kUsage, fmt::format("{} {}: it is {}; give the path of a regular "
                                                   "file to write",
                                                   what, path.string(), kind_of(s)));
    }
    const fs::path dir = fs::absolute(path, ec).parent_path();
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK | X_OK) != 0) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("{} {}: its directory {} does not exist or is not writable; "
                                "create it or give another path",
                                what, path.string(), dir.string()));
    }
}

void write_file_atomically(const fs::path& path, const std::string& text, std::string_view what) {
    // A device or a FIFO is never replaced by a renamed file (as root, /dev/full would be).
    std::error_code ec;
    if (const fs::file_status s = fs::status(path, ec); fs::exists(s) && !fs::is_regular_file(s)) {
        throw Error(ErrorKind::kUsage, fmt::format("{} {}: it is {}; give the path of a regular "
                                                   "file to write",
                                                   what, path.string(), kind_of(s)));
    }
    const fs::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
    const auto fail = [&](const char* step) {
        const std::string reason = std::strerror(errno);
        std::remove(tmp.c_str());
        throw Error(ErrorKind::kIo, fmt::format("cannot write {} {}: {} failed ({}); nothing was "
                                                "written there",
                                                what, path.string(), step, reason));
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail("creating a temporary file beside it");
    for (size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            ::close(fd);
            fail("write");
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) {
        ::close(fd);
        fail("fsync");
    }
    if (::close(fd) != 0)
        fail("close");
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        fail("rename");
}

}  // namespace epo::io
