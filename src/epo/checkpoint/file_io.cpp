#include "epo/checkpoint/file_io.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "epo/core/error.h"

namespace epo::checkpoint {

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw Error(ErrorKind::kIo, fmt::format("cannot open '{}' for reading: {}", path.string(),
                                                std::strerror(errno)));
    }
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec)
        throw Error(ErrorKind::kIo,
                    fmt::format("cannot stat '{}': {}", path.string(), ec.message()));
    std::vector<std::byte> bytes(static_cast<size_t>(size));
    if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
        throw Error(ErrorKind::kIo, fmt::format("cannot read '{}'", path.string()));
    }
    return bytes;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
        throw Error(ErrorKind::kInternal, "OpenSSL EVP_Digest(sha256) failed");
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    hex.reserve(2 * length);
    for (unsigned int i = 0; i < length; ++i) {
        hex.push_back(kHex[digest[i] >> 4]);
        hex.push_back(kHex[digest[i] & 15]);
    }
    return hex;
}

void fsync_path(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        throw Error(ErrorKind::kIo, fmt::format("cannot open '{}' to sync it: {}", path.string(),
                                                std::strerror(errno)));
    }
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) {
        throw Error(ErrorKind::kIo,
                    fmt::format("fsync of '{}' failed: {}", path.string(), std::strerror(err)));
    }
}

void write_file_durably(const std::filesystem::path& path, std::string_view text) {
    const std::filesystem::path tmp = path.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        out.close();
        if (!out) {
            throw Error(ErrorKind::kIo,
                        fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
        }
    }
    fsync_path(tmp);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        throw Error(ErrorKind::kIo, fmt::format("cannot rename '{}' to '{}': {}", tmp.string(),
                                                path.string(), ec.message()));
    }
    fsync_path(path.parent_path().empty() ? "." : path.parent_path());
}

}  // namespace epo::checkpoint
