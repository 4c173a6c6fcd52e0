#include "epo/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace epo::io {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation

[[noreturn]] void corrupt(const std::string& source, const std::string& what) {
    throw Error(ErrorKind::kIo, fmt::format("safetensors file '{}': {}", source, what));
}

bool parse_dtype(const std::string& s, DType* out) {
    static const std::pair<const char*, DType> kTypes[] = {
        {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"I32", DType::kI32}, {"I64", DType::kI64}};
    for (const auto& [name, dt] : kTypes) {
        if (s == name) {
            *out = dt;
            return true;
        }
    }
    return false;
}

std::uint64_t read_u64_le(const std::byte* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) {
        v = (v << 8) | static_cast<std::uint8_t>(p[i]);
    }
    return v;
}

struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
};

std::uint64_t as_count(const json& v, const std::string& source, const std::string& what) {
    if (!v.is_number_unsigned()) {
        corrupt(source, fmt::format("{} must be a non-negative integer, is {}", what, v.dump()));
    }
    return v.get<std::uint64_t>();
}

Entry parse_entry(const std::string& name, const json& v, const std::string& source) {
    if (name.empty()) {
        corrupt(source, "a tensor has an empty name");
    }
    if (!v.is_object()) {
        corrupt(source, fmt::format("entry '{}' is not an object", name));
    }
    for (const auto& [key, _] : v.items()) {
        if (key != "dtype" && key != "shape" && key != "data_offsets") {
            corrupt(source, fmt::format("entry '{}' has an unknown field '{}'", name, key));
        }
    }
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
        corrupt(source, fmt::format("entry '{}' needs dtype, shape and data_offsets", name));
    }
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string()) {
        corrupt(source, fmt::format("dtype of '{}' is not a string", name));
    }
    const std::string dt = v["dtype"].get<std::string>();
    if (!parse_dtype(dt, &e.dtype)) {
        corrupt(source, fmt::format("tensor '{}' has dtype '{}'; supported: F32, BF16, I32, I64",
                                    name, dt));
    }
    const json& shape = v["shape"];
    if (!shape.is_array() || shape.size() > static_cast<std::size_t>(kMaxTensorRank)) {
        corrupt(source, fmt::format("shape of '{}' must be an array of at most {} sizes, is {}",
                                    name, kMaxTensorRank, shape.dump()));
    }
    std::uint64_t numel = 1;
    for (const json& d : shape) {
        const std::uint64_t n = as_count(d, source, fmt::format("a dimension of '{}'", name));
        if (n > (1ull << 40) || __builtin_mul_overflow(numel, n, &numel)) {
            corrupt(source, fmt::format("shape of '{}' is too large: {}", name, shape.dump()));
        }
        e.shape.dims[static_cast<std::size_t>(e.shape.rank++)] = static_cast<std::int64_t>(n);
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) {
        corrupt(source,
                fmt::format("data_offsets of '{}' must be [begin, end], is {}", name, off.dump()));
    }
    e.begin = as_count(off[0], source, fmt::format("data_offsets of '{}'", name));
    e.end = as_count(off[1], source, fmt::format("data_offsets of '{}'", name));
    std::uint64_t bytes = 0;
    if (e.end < e.begin || __builtin_mul_overflow(numel, dtype_size(e.dtype), &bytes) ||
        e.end - e.begin != bytes) {
        corrupt(source, fmt::format("tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] "
                                    "hold {}",
                                    name, dt, e.shape.str(), bytes, e.begin, e.end,
                                    e.end >= e.begin ? e.end - e.begin : 0));
    }
    return e;
}

// The header JSON with duplicate top-level names refused (JSON libraries keep the last one).
json parse_header(std::string_view text, const std::string& source) {
    std::set<std::string> names;
    std::string duplicate;
    const json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth == 1 && event == json::parse_event_t::key) {
            const std::string key = parsed.get<std::string>();
            if (!names.insert(key).second && duplicate.empty()) {
                duplicate = key;
            }
        }
        return true;
    };
    json header;
    try {
        header = json::parse(text.begin(), text.end(), cb);
    } catch (const json::exception& e) {
        corrupt(source, fmt::format("the header is not valid JSON ({})", e.what()));
    }
    if (!duplicate.empty()) {
        corrupt(source, fmt::format("tensor name '{}' appears twice", duplicate));
    }
    if (!header.is_object()) {
        corrupt(source, "the header is not a JSON object");
    }
    return header;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return "F32";
        case DType::kBF16:
            return "BF16";
        case DType::kI32:
            return "I32";
        case DType::kI64:
            return "I64";
    }
    return "?";
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
    for (const NamedTensor& t : tensors) {
        if (t.name == name) {
            return &t.tensor;
        }
    }
    return nullptr;
}

const Tensor& SafetensorsFile::at(std::string_view name) const {
    const Tensor* t = find(name);
    if (t == nullptr) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("safetensors file '{}' has no tensor named '{}'", source, name));
    }
    return *t;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& source) {
    if (bytes.size() < 8) {
        corrupt(source, fmt::format("{} bytes is too short for the 8-byte header length (file "
                                    "truncated?)",
                                    bytes.size()));
    }
    const std::uint64_t n = read_u64_le(bytes.data());
    if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
        corrupt(source, fmt::format("the header length {} exceeds the {} bytes after it (file "
                                    "truncated or not safetensors)",
                                    n, bytes.size() - 8));
    }
    const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
    const json header = parse_header(text, source);
    const std::uint64_t data_size = bytes.size() - 8 - n;

    SafetensorsFile file;
    file.source = source;
    std::vector<Entry> entries;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            if (!value.is_object()) {
                corrupt(source, "__metadata__ is not an object");
            }
            for (const auto& [mk, mv] : value.items()) {
                if (!mv.is_string()) {
                    corrupt(source,
                            fmt::format("metadata '{}' is not a string: {}", mk, mv.dump()));
                }
                file.metadata[mk] = mv.get<std::string>();
            }
            continue;
        }
        entries.push_back(parse_entry(key, value, source));
    }
    // The entries must tile [0, data_size) exactly.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t pos = 0;
    for (const Entry& e : entries) {
        if (e.begin != pos) {
            corrupt(source, e.begin < pos
                                ? fmt::format("tensor '{}' at [{}, {}] overlaps the previous one "
                                              "(ends at {})",
                                              e.name, e.begin, e.end, pos)
                                : fmt::format("a gap of {} bytes before tensor '{}' at {}",
                                              e.begin - pos, e.name, e.begin));
        }
        pos = e.end;
    }
    if (pos != data_size) {
        corrupt(source, pos > data_size
                            ? fmt::format("the tensors need {} data bytes but the file holds {} "
                                          "(file truncated?)",
                                          pos, data_size)
                            : fmt::format("{} bytes after the last tensor", data_size - pos));
    }
    const std::byte* data = bytes.data() + 8 + n;
    for (const Entry& e : entries) {
        Tensor t = Tensor::empty(e.shape, e.dtype);
        if (t.nbytes()) {
            std::memcpy(t.raw(), data + e.begin, t.nbytes());
        }
        file.tensors.push_back(NamedTensor{e.name, t});
    }
    return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw Error(ErrorKind::kIo, fmt::format("cannot open safetensors file '{}': {}", path,
                                                std::strerror(errno)));
    }
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) {
        throw Error(ErrorKind::kIo, fmt::format("cannot stat '{}': {}", path, ec.message()));
    }
    std::vector<std::byte> bytes(static_cast<std::size_t>(size));
    if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
        throw Error(ErrorKind::kIo, fmt::format("cannot read '{}'", path));
    }
    return parse_safetensors(bytes, path);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    json header = json::object();
    if (!metadata.empty()) {
        header["__metadata__"] = metadata;
    }
    std::uint64_t pos = 0;
    std::set<std::string> names;
    for (const NamedTensor& t : tensors) {
        if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("safetensors: tensor name '{}' is empty, reserved or repeated",
                                    t.name));
        }
        json shape = json::array();
        for (int i = 0; i < t.tensor.rank(); ++i) {
            shape.push_back(t.tensor.dim(i));
        }
        header[t.name] = {{"dtype", safetensors_dtype_name(t.tensor.dtype())},
                          {"shape", shape},
                          {"data_offsets", {pos, pos + t.tensor.nbytes()}}};
        pos += t.tensor.nbytes();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned

    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) {
        throw Error(ErrorKind::kIo,
                    fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    }
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) {
        len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
    }
    bool ok = std::fwrite(len, 1, 8, f) == 8 &&
              std::fwrite(text.data(), 1, text.size(), f) == text.size();
    for (const NamedTensor& t : tensors) {
        if (ok && t.tensor.nbytes()) {
            ok = std::fwrite(t.tensor.raw(), 1, t.tensor.nbytes(), f) == t.tensor.nbytes();
        }
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        throw Error(ErrorKind::kIo, fmt::format("cannot write '{}': {}", path, why));
    }
}

}  // namespace epo::io
