// Safetensors files (the ML ecosystem's weight format, https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON, then the tensor data.
//
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//
// Offsets are relative to the start of the data section. We read and write F32, BF16, I32 and I64
// (what this project stores) and refuse any other dtype by name. Reading is strict, as the
// reference implementation is: the JSON must be an object of well-formed entries with no
// duplicate names, each entry's byte size must equal its dtype size times its element count,
// and the entries must tile the data section exactly (no gaps, no overlaps, nothing past the end,
// nothing left over), so a truncated or corrupt file is an epo::Error (kIo) naming the file and
// the problem, never a crash or a silently wrong tensor.
//
// Writing goes to a temporary file in the same directory that is renamed over the target, so a
// reader never sees a half-written file. The header is padded with spaces to a multiple of 8
// bytes so the data section is aligned. x86-64 is little-endian, like the format.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epo/tensor/tensor.h"

namespace epo::io {

struct NamedTensor {
    std::string name;
    Tensor tensor;
};

struct SafetensorsFile {
    std::vector<NamedTensor> tensors;  // in data-offset order
    std::map<std::string, std::string> metadata;

    const Tensor* find(std::string_view name) const;
    // The tensor, or kUsage naming the missing name and the file.
    const Tensor& at(std::string_view name) const;
    std::string source;  // file name, for messages
};

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

SafetensorsFile read_safetensors(const std::string& path);

// Parses a whole file image (what read_safetensors does after reading the file); `source` names
// it in messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& source);

// "F32", "BF16", "I32", "I64".
const char* safetensors_dtype_name(DType dtype);

}  // namespace epo::io
