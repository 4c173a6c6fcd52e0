// Small file operations with the checks a user's path needs before anything is read or written:
// a path that names a directory, a FIFO or a device is refused with its name instead of blocking
// (a FIFO opened for reading waits for a writer for good) or failing deep inside a parser; a file
// written is complete or absent, never a truncated one (written under a temporary name in the
// same directory, flushed and closed with every error checked, then renamed over the target).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace epo::io {

// kUsage naming `what` (e.g. "--calibration"), the path and why, unless `path` is a regular file
// (or a link to one) this process can open for reading.
void require_regular_file(const std::filesystem::path& path, std::string_view what);

// kUsage naming `what` unless `path` can be written as a regular file: it is one, or it does not
// exist and its directory does and is writable. Checked before long work whose result goes there.
void require_writable_file(const std::filesystem::path& path, std::string_view what);

// Writes `text` to `path` atomically (above); kIo naming `what` and the path on any failure (a
// full file system, a lost directory), leaving the previous file, if any, untouched.
void write_file_atomically(const std::filesystem::path& path, const std::string& text,
                           std::string_view what);

}  // namespace epo::io
