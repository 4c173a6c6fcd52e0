// Token dispatch on one rank: which rows each expert gets (dropless or capacity with the drop
// policies and padding), the permutation into expert order and its inverse (the combine), and
// the chunk moves the distributed dispatcher needs around its all-to-all.
//
//   preprocess  counts and the plan: for every expert the tokens it receives in token order
//               (stable), capacity drops, padding rows
//   permute     x_perm[row] = x[token of row]; probs_perm[row] = p of that (token, k) slot
//   combine     y[t] = (sum over k = 0, 1, ... of y_perm[row of (t, k)]) (+ shared expert)[t]
// and their backwards. Rows are laid out in ExpertSegments: expert e's rows start at
// offsets[e]; with an alignment > 1 each segment is padded with zero rows up to a multiple of it
// (the experts' weight-gradient products then run over a bounded set of lengths, see
// docs/numerics.md). Padding rows of capacity mode are different: they are real token rows with
// weight 0, as in the reference, and count in tokens_per_expert.
//
// Letters: T tokens, K top-k, E experts, H hidden, R rows = sum of tokens_per_expert,
// Rp padded rows, C capacity.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "epo/moe/moe_config.h"
#include "epo/tensor/arena.h"

namespace epo::moe {

inline constexpr std::int64_t kExpertRowAlign = 32;

// Where each expert's rows live in a row buffer.
struct ExpertSegments {
    std::vector<std::int64_t> counts;   // [E] rows of each expert
    std::vector<std::int64_t> offsets;  // [E + 1] first row of each expert; the last is the total

    std::int64_t num_experts() const { return static_cast<std::int64_t>(counts.size()); }
    std::int64_t total_rows() const { return offsets.empty() ? 0 : offsets.back(); }
    // counts[e] rounded up to the alignment the segments were made with.
    std::int64_t padded_count(std::int64_t e) const;
};

// Segments for these counts, each starting at a multiple of `align` rows (align 1: packed).
ExpertSegments make_expert_segments(std::span<const std::int64_t> counts, std::int64_t align);
// Experts [begin, end) of `segments` as segments of their own (offsets from the first one's
// row): the rows [segments.offsets[begin], segments.offsets[end]) of a row buffer.
ExpertSegments segment_range(const ExpertSegments& segments, std::int64_t begin, std::int64_t end);
// Upper bound of total_rows() for any counts summing to at most `rows` over `num_experts`.
std::int64_t max_segment_rows(std::int64_t rows, std::int64_t num_experts, std::int64_t align);

struct DispatchPlan {
    std::int64_t num_tokens = 0;                  // T
    std::int64_t topk = 0;                        // K
    std::int64_t num_experts = 0;                 // E
    std::int64_t capacity = -1;                   // C, or -1 when dropless
    std::vector<std::int64_t> tokens_per_expert;  // [E] rows each expert receives
    std::vector<std::int64_t> expert_begin;       // [E + 1] first row of each expert in row order
    Tensor row_token;           // [R] i32 token of each row, rows in expert order then token order
    Tensor row_slot;            // [R] i32 slot t * K + k of each row, -1 for a capacity padding row
    Tensor slot_row;            // [T * K] i32 row of each slot, -1 when the slot was dropped
    std::int64_t num_rows = 0;  // R
    std::int64_t num_dropped = 0;  // slots dropped by capacity
};

// topk_index [T, K] i32 and topk_weight [T, K] f32 from the router.
DispatchPlan dispatch_preprocess(const MoeConfig& cfg, const Tensor& topk_index,
                                 const Tensor& topk_weight, Arena& arena);

// x [T, H] -> x_perm [segments.total_rows(), H] (same dtype), probs_perm [.., 1] f32 (a [Rp]
// tensor). segments must have the plan's tokens_per_expert as counts; alignment rows are zeroed.
void permute_forward(const DispatchPlan& plan, const ExpertSegments& segments, const Tensor& x,
                     const Tensor& topk_weight, const Tensor& x_perm, const Tensor& probs_perm);

// dx_acc [T, H] f32 = sum over k of dx_perm[row of (t, k)] (overwrites; dropped slots add
// nothing); dweight [T, K] f32 = dprobs_perm[row of (t, k)], 0 when dropped.
void permute_backward(const DispatchPlan& plan, const ExpertSegments& segments,
                      const Tensor& dx_perm, const Tensor& dprobs_perm, const Tensor& dx_acc,
                      const Tensor& dweight);
// Its two halves, for a caller that fuses the rows into a pass of its own: dweight alone, and
// token t's row of dx_acc into acc[0, H) (token_row_sum of dx_perm: the same operations, so the
// same bits).
void gather_dweight(const DispatchPlan& plan, const ExpertSegments& segments,
                    const Tensor& dprobs_perm, const Tensor& dweight);
// acc[0, H) = sum over token t's kept slots, in k order, of its rows of `rows` ([Rp, H], any
// compute dtype), in f32; zero when all its slots were dropped. The combine's and the unpermute's
// per-token sum.
void token_row_sum(const DispatchPlan& plan, const ExpertSegments& segments, const Tensor& rows,
                   std::int64_t t, float* acc);

// y [T, H] (any compute dtype) = round(sum over k of y_perm[row of (t, k)] + shared[t]); the sum
// is in f32 in k order, then the shared-expert row (f32 [T, H], may be undefined) is added.
void combine_forward(const DispatchPlan& plan, const ExpertSegments& segments, const Tensor& y_perm,
                     const Tensor& shared, const Tensor& y);

// dy_perm[row] = dy[token of row] for routed rows; capacity padding rows and alignment rows 0.
void combine_backward(const DispatchPlan& plan, const ExpertSegments& segments, const Tensor& dy,
                      const Tensor& dy_perm);

// Zeroes the alignment rows of every segment (rows counts[e] .. padded_count(e)), or of the
// segments of experts [begin, end).
void zero_segment_padding(const ExpertSegments& segments, const Tensor& rows);
void zero_segment_padding(const ExpertSegments& segments, const Tensor& rows, std::int64_t begin,
                          std::int64_t end);

// --- chunk moves for the distributed dispatcher -----------------------------------------------

// Row chunk i moves from src rows [src_offsets[i], + sizes[i]) to dst rows [dst_offsets[i], ...).
struct ChunkMoves {
    std::vector<std::int64_t> src_offsets;
    std::vector<std::int64_t> dst_offsets;
    std::vector<std::int64_t> sizes;
};

// After the dispatch all-to-all the rows arrive source-rank-major: for rank s, for local expert l,
// counts[s * L + l] rows, back to back. The experts want expert-major segments (`segments`,
// counts[l] = sum over s of counts[s * L + l]), source ranks in order inside each. Returns the
// moves received -> segments.
ChunkMoves rank_major_to_expert_major(std::span<const std::int64_t> counts, std::int64_t num_ranks,
                                      const ExpertSegments& segments);
// The same moves backwards (segments -> send order of the combine all-to-all).
ChunkMoves invert(const ChunkMoves& moves);
// Moves [begin, end) of `moves` (rank_major_to_expert_major's are expert-major: local expert l's
// are [l * num_ranks, (l + 1) * num_ranks)).
ChunkMoves sub_moves(const ChunkMoves& moves, std::size_t begin, std::size_t end);
// Applies the moves; src and dst are row buffers of one dtype and row width.
void move_chunks(const Tensor& src, const ChunkMoves& moves, const Tensor& dst);

}  // namespace epo::moe
