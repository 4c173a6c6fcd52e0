// Value types of the configuration tree that are not plain C++ scalars: the enumerations (each
// with the exact spellings users write in YAML), value limits, and the two "int or list" style
// fields the reference system accepts.
//
// Every enumeration is contiguous from 0 and has a kEnumNames<E> table in the same order; the
// generic readers and writers of the tree use the table, so an enum is spelled in one place.
// This header deliberately holds no field lists: each section's fields live with its struct.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace epo::config {

// Spellings of each enumeration, indexed by its value (specialized next to each enum below).
template <class E>
inline constexpr std::array<std::string_view, 0> kEnumNames{};

template <class E>
inline constexpr bool kHasEnumNames = kEnumNames<E>.size() > 0;

template <class E>
concept ConfigEnum = std::is_enum_v<E> && kHasEnumNames<E>;

template <ConfigEnum E>
constexpr std::string_view enum_name(E value) {
    return kEnumNames<E>[static_cast<std::size_t>(value)];
}

template <ConfigEnum E>
constexpr std::optional<E> parse_enum(std::string_view text) {
    for (std::size_t i = 0; i < kEnumNames<E>.size(); ++i) {
        if (kEnumNames<E>[i] == text) {
            return static_cast<E>(i);
        }
    }
    return std::nullopt;
}

// "a, b or c" for messages.
template <ConfigEnum E>
std::string enum_choices() {
    std::string out;
    const auto& names = kEnumNames<E>;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0) {
            out += i + 1 == names.size() ? " or " : ", ";
        }
        out += names[i];
    }
    return out;
}

enum class DispatcherType { kAllgather, kAlltoall, kFlex };
template <>
inline constexpr auto kEnumNames<DispatcherType> =
    std::to_array<std::string_view>({"allgather", "alltoall", "flex"});

enum class FlexBackend { kDeepep, kHybridep };
template <>
inline constexpr auto kEnumNames<FlexBackend> = std::to_array<std::string_view>({"deepep",
                                                                                 "hybridep"});

// How model.moe_ep_overlap_num_chunks splits a MoE layer's dispatch (docs/chunked-overlap.md):
// by groups of each rank's local experts. `tokens` (slices of the micro-batch's tokens) is still
// read, so that a configuration asking for it gets rule MO007's reason and fix instead of an
// unknown value; nothing runs it.
enum class ChunkSplit { kExperts, kTokens };
template <>
inline constexpr auto kEnumNames<ChunkSplit> = std::to_array<std::string_view>({"experts",
                                                                                "tokens"});
// Why chunks by tokens were removed, and what to set instead: rule MO007 and the MoE layer's
// own check (moe_config_from) give these words.
inline constexpr std::string_view kTokenChunksRemoved =
    "chunks by tokens were removed: measured on the bench proxy, they made the compute stream "
    "1.3-1.5x busier (each chunk's expert products a C-th of the rows, each chunk padding its own "
    "expert segments), so on one fixed link every token-chunked schedule took longer per step "
    "than unchunked overlap with delayed wgrad (docs/measurements.md, \"2026-12-02: token "
    "chunks\"); chunks by experts keep every product whole and are bit-identical to 1 chunk";
inline constexpr std::string_view kTokenChunksFix =
    "set model.moe_ep_overlap_chunk_by=experts (the default) or remove the key";

enum class ScoreFunction { kSoftmax, kSigmoid };
template <>
inline constexpr auto kEnumNames<ScoreFunction> = std::to_array<std::string_view>({"softmax",
                                                                                   "sigmoid"});

enum class LoadBalancingType { kAuxLoss, kSeqAuxLoss, kGlobalAuxLoss, kSinkhorn, kNone };
template <>
inline constexpr auto kEnumNames<LoadBalancingType> = std::to_array<std::string_view>(
    {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"});

enum class TokenDropPolicy { kProbs, kPosition };
template <>
inline constexpr auto kEnumNames<TokenDropPolicy> = std::to_array<std::string_view>({"probs",
                                                                                     "position"});

enum class RouterDtype { kFp32, kFp64 };
template <>
inline constexpr auto kEnumNames<RouterDtype> = std::to_array<std::string_view>({"fp32", "fp64"});

enum class RecomputeGranularity { kSelective, kFull };
template <>
inline constexpr auto kEnumNames<RecomputeGranularity> =
    std::to_array<std::string_view>({"selective", "full"});

enum class RecomputeMethod { kUniform, kBlock };
template <>
inline constexpr auto kEnumNames<RecomputeMethod> = std::to_array<std::string_view>({"uniform",
                                                                                     "block"});

enum class RecomputeModule {
    kCoreAttn,
    kMoeAct,
    kLayernorm,
    kMlaUpProj,
    kMlp,
    kMoe,
    kSharedExperts
};
template <>
inline constexpr auto kEnumNames<RecomputeModule> = std::to_array<std::string_view>(
    {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"});

enum class CudaGraphImpl { kNone, kLocal, kTransformerEngine };
template <>
inline constexpr auto kEnumNames<CudaGraphImpl> =
    std::to_array<std::string_view>({"none", "local", "transformer_engine"});

enum class CudaGraphModule { kAttn, kMlp, kMoe, kMoeRouter, kMoePreprocess, kMamba };
template <>
inline constexpr auto kEnumNames<CudaGraphModule> = std::to_array<std::string_view>(
    {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"});

enum class Normalization { kLayerNorm, kRMSNorm };
template <>
inline constexpr auto kEnumNames<Normalization> = std::to_array<std::string_view>({"LayerNorm",
                                                                                   "RMSNorm"});

enum class ActivationFunc { kGelu, kSilu };
template <>
inline constexpr auto kEnumNames<ActivationFunc> = std::to_array<std::string_view>({"gelu",
                                                                                    "silu"});

enum class PositionEmbedding { kLearnedAbsolute, kRope, kNone };
template <>
inline constexpr auto kEnumNames<PositionEmbedding> =
    std::to_array<std::string_view>({"learned_absolute", "rope", "none"});

enum class LrDecayStyle { kConstant, kLinear, kCosine };
template <>
inline constexpr auto kEnumNames<LrDecayStyle> =
    std::to_array<std::string_view>({"constant", "linear", "cosine"});

enum class DatasetType { kMock, kText };
template <>
inline constexpr auto kEnumNames<DatasetType> = std::to_array<std::string_view>({"mock", "text"});

// Which layers are MoE layers, as in Megatron-Core's moe_layer_freq: an integer N means every
// N-th layer (layer i is MoE when i % N == 0), a list gives one 0 (dense) or 1 (MoE) per layer.
// DeepSeek-V3's "first 3 dense" is the list [0, 0, 0, 1, 1, ...].
using MoeLayerFreq = std::variant<int, std::vector<int>>;

// The legacy `cuda_graph_scope` value: a comma-separated string or a list of names.
using CudaGraphScopeValue = std::variant<std::string, std::vector<std::string>>;

// Allowed range of a numeric field, checked by the validator (rule VA001) so that every
// out-of-range value is reported at once with the others. Applies to the value of an optional
// field when it is set, and to every element of a list.
struct Limits {
    double min = -std::numeric_limits<double>::infinity();
    double max = std::numeric_limits<double>::infinity();
    bool min_exclusive = false;

    static constexpr Limits none() { return {}; }
    static constexpr Limits at_least(double lo) { return {lo}; }
    static constexpr Limits above(double lo) {
        return {lo, std::numeric_limits<double>::infinity(), true};
    }
    static constexpr Limits between(double lo, double hi) { return {lo, hi}; }

    bool contains(double v) const { return (min_exclusive ? v > min : v >= min) && v <= max; }
    std::string describe() const;  // "at least 1", "greater than 0", "between 0 and 1"
};

// Tag that marks a struct as a section of the tree: it has a static
// `fields(Self& s, Visitor&& v)` calling v(name, s.field[, limits]) once per field, in order.
template <class T>
concept Section = requires {
    typename T::IsSection;
};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

}  // namespace epo::config
