#include "epo/checkpoint/start_checks.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "epo/core/error.h"

namespace epo::checkpoint {

namespace fs = std::filesystem;

void check_save_dir_writable(const fs::path& dir) {
    const std::string fix =
        "give checkpoint.save a directory this user can create and write, or set it to null "
        "(nothing saved)";
    std::error_code ec;
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("checkpoint.save = '{}' is not a directory ({}); {}", dir.string(),
                                fs::is_character_file(dir, ec) ? "a device" : "a file", fix));
    }
    fs::create_directories(dir, ec);
    if (ec) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("checkpoint.save = '{}' cannot be created ({}); {}", dir.string(),
                                ec.message(), fix));
    }
    // Permission bits do not tell (root ignores them, a read-only mount ignores root): write.
    const fs::path probe = dir / fmt::format(".epo-write-test-{}", ::getpid());
    {
        std::ofstream out(probe);
        out << "epo\n";
        out.close();
        if (!out) {
            fs::remove(probe, ec);
            throw Error(ErrorKind::kConfig,
                        fmt::format("checkpoint.save = '{}' is not writable ({}); {}", dir.string(),
                                    std::strerror(errno), fix));
        }
    }
    fs::remove(probe, ec);
}

}  // namespace epo::checkpoint
