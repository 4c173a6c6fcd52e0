#include "epo/checkpoint/file_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <span>

#include "epo/core/error.h"

namespace epo::checkpoint {
namespace {

TEST(FileIo, Sha256MatchesTheStandardTestVector) {
    const std::string abc = "abc";
    EXPECT_EQ(sha256_hex(std::as_bytes(std::span(abc.data(), abc.size()))),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(FileIo, DurableWriteReplacesTheWholeFile) {
    const auto path =
        std::filesystem::temp_directory_path() / ("epo_durable_" + std::to_string(::getpid()));
    write_file_durably(path, "first version, longer\n");
    write_file_durably(path, "second\n");
    const std::vector<std::byte> bytes = read_file_bytes(path);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "second\n");
    EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
    std::filesystem::remove(path);
    EXPECT_THROW(read_file_bytes(path), Error);
}

}  // namespace
}  // namespace epo::checkpoint
