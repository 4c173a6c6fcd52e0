// The file operations a checkpoint needs to survive a crash: reading a file whole, its SHA-256,
// and fsync of files and directories.
//
// Why fsync: rename() makes a new name visible atomically, but without fsync the renamed file's
// data (or the rename itself, which lives in the directory) may still be only in the page cache
// when the machine goes down. A checkpoint is therefore complete only after its files, then its
// directory, then the parent directory holding the final name have been synced.
//
// SHA-256 (OpenSSL) rather than a CRC: the digests in a checkpoint's metadata.json can be checked
// by hand with `sha256sum`.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace epo::checkpoint {

// The whole file; kIo naming the file when it cannot be opened or read.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

// Lower-case hex SHA-256 of the bytes (64 characters).
std::string sha256_hex(std::span<const std::byte> bytes);

// fsync of a file or a directory (opened read-only); kIo naming the path on failure.
void fsync_path(const std::filesystem::path& path);

// Writes `text` to `path` durably: a temporary file beside it, fsync, rename over `path`, fsync
// of the directory. A reader sees the old content or the new, never a mix.
void write_file_durably(const std::filesystem::path& path, std::string_view text);

}  // namespace epo::checkpoint
