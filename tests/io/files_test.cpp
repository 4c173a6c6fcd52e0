// Paths a user gives: refused by kind before they are read or written, and files written whole
// or not at all.
#include "epo/io/files.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "epo/core/error.h"

namespace epo::io {
namespace {
namespace fs = std::filesystem;

struct TempDir {
    fs::path path = fs::temp_directory_path() / ("epo_files_" + std::to_string(::getpid()));
    TempDir() { fs::create_directories(path); }
    ~TempDir() { fs::remove_all(path); }
};

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(RequireRegularFile, RefusesDirectoriesFifosAndDevicesByKind) {
    TempDir dir;
    const fs::path fifo = dir.path / "pipe";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    // A FIFO opened for reading would wait for a writer for good: refused without opening it.
    EXPECT_NE(message_of([&] {
                  require_regular_file(fifo, "--calibration");
              }).find("it is a FIFO (named pipe); give a regular file"),
              std::string::npos);
    EXPECT_NE(message_of([&] {
                  require_regular_file(dir.path, "--calibration");
              }).find("it is a directory"),
              std::string::npos);
    EXPECT_NE(message_of([&] { require_regular_file("/dev/null", "--x"); }).find("it is a device"),
              std::string::npos);
    EXPECT_NE(
        message_of([&] { require_regular_file(dir.path / "none", "--x"); }).find("no such file"),
        std::string::npos);
    std::ofstream(dir.path / "ok") << "{}";
    EXPECT_EQ(message_of([&] { require_regular_file(dir.path / "ok", "--x"); }), "");
}

TEST(RequireWritableFile, RefusesDevicesAndMissingDirectories) {
    TempDir dir;
    EXPECT_NE(message_of([&] {
                  require_writable_file("/dev/full", "--out");
              }).find("--out /dev/full: it is a device"),
              std::string::npos);
    EXPECT_NE(message_of([&] {
                  require_writable_file(dir.path / "no" / "f.json", "--out");
              }).find("does not exist or is not writable"),
              std::string::npos);
    EXPECT_EQ(message_of([&] { require_writable_file(dir.path / "f.json", "--out"); }), "");
}

TEST(WriteFileAtomically, WritesWholeOrLeavesThePreviousFile) {
    TempDir dir;
    const fs::path target = dir.path / "cal.json";
    write_file_atomically(target, "first\n", "the calibration file");
    std::ifstream in(target);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "first");
    // A file system that takes no more bytes (a file-size limit stands in for a full disk: the
    // write fails with EFBIG as with ENOSPC): an error, and the previous file is untouched.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    struct sigaction previous {};
    sigaction(SIGXFSZ, &ignore, &previous);
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit small = old;
    small.rlim_cur = 16;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const std::string error = message_of(
        [&] { write_file_atomically(target, std::string(4096, 'x'), "the calibration file"); });
    setrlimit(RLIMIT_FSIZE, &old);
    sigaction(SIGXFSZ, &previous, nullptr);
    EXPECT_NE(error.find("cannot write the calibration file"), std::string::npos) << error;
    EXPECT_EQ(fs::file_size(target), 6u);
    // No temporary file left behind.
    int files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path))
        ++files;
    EXPECT_EQ(files, 1);
    // A device is never replaced by a renamed file.
    EXPECT_NE(message_of([&] {
                  write_file_atomically("/dev/full", "x", "--out");
              }).find("it is a device"),
              std::string::npos);
}

}  // namespace
}  // namespace epo::io
