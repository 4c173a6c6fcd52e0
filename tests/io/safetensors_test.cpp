#include "epo/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "epo/tensor/random.h"

namespace epo::io {
namespace {

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("epo_st_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

std::vector<std::byte> file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> b(c.size());
    std::memcpy(b.data(), c.data(), c.size());
    return b;
}

// A file image from a header text and a data section.
std::vector<std::byte> image(const std::string& header, std::size_t data_bytes) {
    std::vector<std::byte> b(8 + header.size() + data_bytes, std::byte{0});
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) {
        b[i] = static_cast<std::byte>(n >> (8 * i));
    }
    std::memcpy(b.data() + 8, header.data(), header.size());
    return b;
}

void expect_refused(const std::vector<std::byte>& bytes, const std::string& fragment) {
    try {
        parse_safetensors(bytes, "bad.safetensors");
        ADD_FAILURE() << "accepted a file that should be refused (" << fragment << ")";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kIo);
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos);
    }
}

TEST(Safetensors, RoundTripEveryDtypeWithMetadata) {
    Tensor f = Tensor::empty({3, 5}, DType::kF32);
    fill_normal(f, 1, 0.0f, 1.0f);
    Tensor h = Tensor::empty({2, 2, 3}, DType::kBF16);
    fill_normal(h, 2, 0.0f, 1.0f);
    Tensor i32 = Tensor::empty({4}, DType::kI32);
    for (int i = 0; i < 4; ++i) {
        i32.data<std::int32_t>()[i] = -i * 1000;
    }
    Tensor i64 = Tensor::empty({1}, DType::kI64);
    i64.data<std::int64_t>()[0] = 1ll << 40;
    Tensor scalar = Tensor::empty({}, DType::kF32);
    scalar.data<float>()[0] = 0.25f;
    Tensor empty = Tensor::empty({0, 7}, DType::kF32);
    const std::string path = temp_path("roundtrip.safetensors");
    write_safetensors(
        path,
        {{"w", f}, {"h.bf16", h}, {"ids", i32}, {"big", i64}, {"loss", scalar}, {"none", empty}},
        {{"format", "pt"}, {"model", "tiny"}});
    // Data section starts 8-byte aligned.
    const std::vector<std::byte> bytes = file_bytes(path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);

    SafetensorsFile file = read_safetensors(path);
    EXPECT_EQ(file.metadata.at("model"), "tiny");
    EXPECT_EQ(file.tensors.size(), 6u);
    auto same = [](const Tensor& a, const Tensor& b) {
        return a.shape() == b.shape() && a.dtype() == b.dtype() &&
               std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    };
    EXPECT_TRUE(same(file.at("w"), f));
    EXPECT_TRUE(same(file.at("h.bf16"), h));
    EXPECT_TRUE(same(file.at("ids"), i32));
    EXPECT_TRUE(same(file.at("big"), i64));
    EXPECT_TRUE(same(file.at("loss"), scalar));
    EXPECT_EQ(file.at("none").shape(), Shape({0, 7}));
    EXPECT_EQ(file.find("missing"), nullptr);
    EXPECT_THROW(file.at("missing"), Error);
    std::remove(path.c_str());
}

TEST(Safetensors, AcceptsAHandWrittenFile) {
    // As another library writes it: a header with spaces, offsets in any key order.
    const std::string header =
        R"({"b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},)"
        R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}   )";
    std::vector<std::byte> b = image(header, 12);
    const float two[2] = {1.5f, -2.0f};
    std::memcpy(b.data() + 8 + header.size(), two, 8);
    SafetensorsFile f = parse_safetensors(b, "hand.safetensors");
    EXPECT_EQ(f.tensors[0].name, "a");  // data order
    EXPECT_EQ(f.at("a").data<float>()[1], -2.0f);
}

TEST(Safetensors, RefusesTruncatedAndCorruptFiles) {
    const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    EXPECT_NO_THROW(parse_safetensors(image(good, 8), "ok"));
    // Truncated: data cut short, header cut short, length field cut short.
    expect_refused(image(good, 5), "truncated");
    std::vector<std::byte> cut = image(good, 8);
    cut.resize(20);
    expect_refused(cut, "header length");
    cut.resize(5);
    expect_refused(cut, "too short");
    expect_refused(image(good, 12), "after the last tensor");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8),
                   "not valid JSON");
    expect_refused(image(R"([1,2])", 0), "not a JSON object");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                   "needs 12 bytes");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                   "gap of 4 bytes");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         8),
                   "overlaps");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                         16),
                   "appears twice");
    expect_refused(image(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
                   "dtype 'F16'");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                   "non-negative integer");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                   "data_offsets [8, 0]");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "needs dtype, shape");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                   "unknown field 'x'");
    expect_refused(image(R"({"__metadata__":{"k":3}})", 0), "not a string");
    expect_refused(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                         R"("data_offsets":[0,8]}})",
                         8),
                   "too large");
}

TEST(Safetensors, MissingFileAndBadNamesAreErrors) {
    try {
        read_safetensors(temp_path("does_not_exist.safetensors"));
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kIo);
    }
    Tensor t = Tensor::zeros({1}, DType::kF32);
    EXPECT_THROW(write_safetensors(temp_path("dup.safetensors"), {{"a", t}, {"a", t}}), Error);
    EXPECT_THROW(write_safetensors(temp_path("meta.safetensors"), {{"__metadata__", t}}), Error);
}

}  // namespace
}  // namespace epo::io
