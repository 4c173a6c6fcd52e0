// The GPT-style MoE model: token embedding, L transformer layers (dense or MoE per the layer
// pattern), final RMSNorm, output layer and cross-entropy loss, executed node by node.
//
//   forward:  x0 = embed(tokens); x_{l+1} = layer_l(x_l); loss = CE(Wout norm(x_L), labels)
//   backward: the same list reversed; every weight gradient accumulates into its main_grad
//
// Model positions, each with its own node functions: the embedding (-1), the layers 0..L-1 and
// the output position L (final norm, output layer and loss). Between positions the activations
// and their gradients travel in explicit hand-off tensors: x[l] is the input of position l (x[L]
// the final norm's), dx[l] its gradient.
// With multi-token prediction (mtp.h, GptShape::mtp_num_layers = 1) the MTP's transformer layer
// is the last layer position, L-1: its pre_dispatch forward first runs the MTP prologue (the
// decoder's final norm, then [enorm(e), hnorm(h)] projected to H), its pre_dispatch backward
// ends with the prologue's backward; the embedding position also looks up the shifted tokens
// (e), and the output position runs the main head on the final norm's output h (kept in the
// micro-batch's MtpState) and the MTP head on x[L] (the MTP layer's output).
//
// The model runs one schedule::NodeCall at a time (run()), on whichever stream the schedule
// put it; every micro-batch of the step has its own states, so any number of micro-batches can
// be between forward and backward at once through one set of weights (the overlap schedule has
// two, a pipeline schedule more). Layer states, output states and hand-off tensors come from
// pools as a micro-batch's forward reaches them and go back when its backward is done; the pools
// report the bytes in use and their peak (the "peak activation bytes" metric).
// With pipeline parallelism the model holds only its stage's positions (the others' parameters
// are not allocated), and the hand-off tensors at a chunk's edges are filled and emptied by the
// pipeline's transfers (transfer_tensor / transfer_done) instead of a neighbouring position.
// forward_backward() is the same work as a straight list of calls, one micro-batch after
// another on the calling thread: the reference both schedules are tested against.
//
// Letters: T tokens per micro-batch (micro_batch_size x seq_length), H hidden, V vocabulary,
// L layers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "epo/model/embedding.h"
#include "epo/model/lm_head.h"
#include "epo/model/mtp.h"
#include "epo/model/transformer_layer.h"
#include "epo/schedule/schedule.h"

namespace epo::config {
struct Config;
}

namespace epo::model {

// Layers [first, end) of one pipeline model chunk.
struct LayerRange {
    int64_t first = 0;
    int64_t end = 0;
};

struct GptShape {
    int64_t num_layers = 0;
    int64_t hidden = 0;
    int64_t vocab = 0;
    int64_t seq_length = 0;
    int64_t micro_batch_size = 1;
    AttentionShape attn;
    bool multi_latent_attention = false;  // self-attention is MLA (mla) instead of attn
    MlaShape mla;
    float norm_eps = 1e-6f;
    double rotary_base = 10000.0;
    float init_std = 0.02f;
    int64_t ffn_hidden = 0;
    std::vector<bool> moe_layers;  // [L]
    // Multi-token prediction (mtp.h): 0, or 1 MTP layer; then layer L-1 (counted in num_layers
    // and moe_layers: MoE when the decoder's last layer is, as Megatron-Core's MTP layer takes the
    // last layer's spec) is the MTP's transformer layer, and the decoder has L-1 layers. The MTP
    // loss enters the objective times mtp_loss_scale (mtp_loss_scaling_factor / mtp_num_layers).
    int64_t mtp_num_layers = 0;
    float mtp_loss_scale = 0.1f;
    moe::MoeConfig moe;
    int ep_size = 1;
    int ep_rank = 0;
    int ep_ranks_per_node = 0;  // flex: EP ranks per node (flex_ranks_per_node), else 0
    bool tie_embeddings = false;
    bool gradient_accumulation_fusion = false;
    DType compute_dtype = DType::kBF16;
    // Selective recompute of the layers' norms and dense MLPs (core_attn is attn's, moe_act and
    // shared_experts moe's; transformer_layer.h).
    LayerRecompute recompute;
    // Full recompute (schedule.h "Full recompute"): [L] the first layer of layer l's recompute
    // group, -1 for a layer that keeps its activations; empty: none. A recomputed layer's state
    // goes back to the pool after its last forward node (and so does its input, unless it is the
    // group's first layer); its recompute calls rebuild both before its backward.
    std::vector<int> recompute_first;
    // Pipeline parallelism (schedule/pipeline_schedule.h): P stages of V model chunks, this
    // rank's stage, and the layers each chunk holds: config/pipeline_layout.h's layout (even,
    // uneven first / last stages, Megatron's layout string), [stage][chunk]. Stage 0 holds the
    // embedding, stage P-1 the output position. Empty: every layer on one stage (PP = VPP = 1).
    int pipeline_size = 1;
    int virtual_pipeline_size = 1;
    int pipeline_rank = 0;
    std::vector<std::vector<LayerRange>> pipeline_chunks;
    // Tensor parallelism (tensor_parallel.h) over tp_size ranks, this rank's place tp_rank, with
    // or without sequence parallelism. The model holds its shards (heads, groups, FFN columns,
    // vocabulary rows; the norms, router and experts whole), initialised as the TP 1 weights and
    // sliced, so TP n computes what TP 1 does; the hand-off tensors are the rank's local_tokens()
    // rows. Its collectives run on the stream's tp communicator (DispatchComms::tp). Not with
    // MLA, MTP, tied embeddings or the layernorm recompute.
    int tp_size = 1;
    int tp_rank = 0;
    bool sequence_parallel = false;
    // Expert tensor parallelism (alltoall_dispatcher.h) over etp_size ranks, this rank's place
    // etp_rank: each rank holds the 1/etp_size shard of its local experts' FFN (fc1's gate and up
    // rows, fc2's columns), initialised as the ETP 1 experts and sliced, so ETP n computes what
    // ETP 1 does; its dispatcher gathers the ETP group's tokens and reduce-scatters the partial
    // outputs on the stream's etp communicator (DispatchComms::etp). alltoall only.
    int etp_size = 1;
    int etp_rank = 0;

    LayerRange chunk_layers(int stage, int chunk) const {
        if (pipeline_chunks.empty())
            return LayerRange{0, num_layers};
        return pipeline_chunks.at(static_cast<size_t>(stage)).at(static_cast<size_t>(chunk));
    }
    // The stage holding layer l.
    int stage_of_layer(int64_t l) const {
        for (size_t s = 0; s < pipeline_chunks.size(); ++s)
            for (const LayerRange& r : pipeline_chunks[s])
                if (l >= r.first && l < r.end)
                    return static_cast<int>(s);
        return 0;
    }
    // Whether this rank's stage holds model position p (-1 the embedding, 0..L-1 the layers, L
    // the output position).
    bool holds(int64_t position) const {
        if (position < 0)
            return pipeline_rank == 0;
        if (position >= num_layers)
            return pipeline_rank == pipeline_size - 1;
        return stage_of_layer(position) == pipeline_rank;
    }
    // Embedding copy: with stages, multi-token prediction (which looks up the shifted tokens) and
    // tied embeddings (whose output layer is the embedding) need the word embedding on the last
    // stage too. As in the reference, that stage holds a copy, initialised like stage 0's (the
    // same name, so the same seeded values); the embedding group (comm/process_groups.h) sums the
    // two copies' gradients before the optimizer step, so they stay equal. The copy is listed
    // at the position whose backward completes its gradient: the MTP layer's, else the output's.
    bool has_embedding_copies() const {
        return pipeline_size > 1 && (mtp_num_layers > 0 || tie_embeddings);
    }
    bool holds_embedding_copy() const {
        return has_embedding_copies() && pipeline_rank == pipeline_size - 1;
    }
    int64_t embedding_copy_position() const {
        return mtp_num_layers > 0 ? num_layers - 1 : num_layers;
    }
    int64_t tokens() const { return micro_batch_size * seq_length; }
    // Rows of the residual stream on this rank: the sequence shard under SP, else all tokens.
    int64_t local_tokens() const { return sequence_parallel ? tokens() / tp_size : tokens(); }
    int64_t num_decoder_layers() const { return num_layers - mtp_num_layers; }
    bool is_mtp_layer(int64_t l) const { return mtp_num_layers > 0 && l == num_layers - 1; }
    int64_t num_local_experts() const { return moe.num_experts / ep_size; }
};

// The model shape a finalized configuration describes, for this rank's place in the EP group and
// the pipeline (its stage). Raises Error(kConfig) for a pipeline split the configuration cannot
// make (config/pipeline_layout.h).
GptShape gpt_shape_from_config(const config::Config& cfg, int ep_size, int ep_rank,
                               int pipeline_rank = 0);

// Activations of one micro-batch at the output position: the final norm and the loss head (its
// input is the hand-off tensor x[L]).
struct OutputState {
    Arena arena{"output activations"};
    size_t reported_bytes = 0;
    Tensor normed;  // (T, H) compute dtype
    Tensor rstd;    // (T) f32
    LmHeadContext head;
    Tensor d_normed;  // (T, H) f32 gradient of the final-norm output (with MTP: the MTP norm's)
    // Multi-token prediction: the MTP's final norm of x[L] and its head (the main head then reads
    // the MtpState's h, and `normed` views it).
    Tensor mtp_normed;  // (T, H) compute dtype
    Tensor mtp_rstd;    // (T) f32
    LmHeadContext mtp_head;
};

// A hand-off tensor between two model positions: (T, H) f32, in an arena of its own so that a
// pool can reuse its memory.
struct HandoffState {
    Arena arena{"hand-off tensors"};
    size_t reported_bytes = 0;
    Tensor t;  // (T, H) f32
};

// Activation bytes held by all states of a model, and their peak (both streams update it).
struct ActivationMeter {
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> peak{0};
    void add(int64_t delta);
};

// Hands out states, reusing their arenas (so steady-state steps map no new memory), and keeps
// the meter up to date. Thread-safe: both streams acquire and release.
template <class State>
class StatePool {
public:
    explicit StatePool(ActivationMeter& meter) : meter_(meter) {}
    State* acquire();
    // Resets the state (keeping its arena's memory) and takes it back.
    void release(State* s);
    // Accounts the bytes a node added to the state's arena (by the thread running the node).
    void account(State* s);

private:
    ActivationMeter& meter_;
    std::mutex mutex_;
    std::vector<std::unique_ptr<State>> all_;
    std::vector<State*> free_;
};

struct MicroBatchResult {
    double lm_loss = 0;   // mean cross-entropy over the micro-batch's tokens
    double mtp_loss = 0;  // the MTP head's, over every position but each sequence's last
};

class GptModel {
public:
    explicit GptModel(const GptShape& shape);
    GptModel(const GptModel&) = delete;
    GptModel& operator=(const GptModel&) = delete;

    const GptShape& shape() const { return shape_; }

    // Seeded N(0, init_std) weights (output projections scaled by 1/sqrt(2L), norms 1). Element
    // values depend only on the seed and the parameter's global index, never on the EP layout:
    // expert e has the same weights whichever rank holds it.
    void init_weights(uint64_t seed);

    // Parameters replicated over data-parallel ranks / the experts held by this rank.
    const std::vector<Param*>& dense_params() const { return dense_params_; }
    const std::vector<Param*>& expert_params() const { return expert_params_; }
    std::vector<Param*> all_params() const;
    // Tensor parallelism: the dense parameters that every TP rank holds whole but whose
    // gradients cover only the rank's part of the work, so the TP group must sum them before the
    // data-parallel reduction (Megatron-Core's finalize_model_grads): the q/k norms (the rank's
    // heads) always; with sequence parallelism also the norms, the router and the shared expert
    // (the rank's rows). Empty at TP 1. (The experts see the rank's rows too; their gradients
    // are summed by the expert-data-parallel group, which contains the TP group at ETP 1.)
    const std::vector<Param*>& tp_summed_params() const { return tp_summed_params_; }
    // Tensor parallelism: the dense parameters every TP rank holds whole (norms, router, shared
    // expert; a superset of tp_summed_params()), which the gradient norm counts once; the other
    // dense parameters are TP shards. Empty at TP 1.
    const std::vector<Param*>& tp_replicated_params() const { return tp_replicated_params_; }
    // The parameters at one model position (schedule.h: -1 the embedding, 0..L-1 the layers, L
    // the final norm and output layer), whose gradients are final once the last micro-batch's
    // backward has passed that position. With tied embeddings the output layer's weight is the
    // embedding's (position -1).
    struct PositionParams {
        std::vector<Param*> dense, expert;
    };
    PositionParams params_at(int position);
    // The word embedding this rank holds when the model has two copies of it (stage 0's and the
    // last stage's, GptShape::has_embedding_copies), else null: the embedding group sums its
    // gradient.
    Param* embedding_copy();
    LayerParams& layer(int l) { return layers_[static_cast<size_t>(l)]; }

    // Before issuing a step: the step's micro-batches (tokens and labels, T each) and the factor
    // each loss gradient carries (1 / number of micro-batches).
    void begin_step(std::vector<std::vector<int32_t>> tokens,
                    std::vector<std::vector<int32_t>> labels, float loss_grad_scale);
    // Executes one node call. `ep` is the EP communicator of the stream it runs on, `scratch`
    // that stream's scratch arena. Micro-batch indices run from 0 to the step's count - 1.
    void run(const schedule::NodeCall& call, const moe::DispatchComms& comms, Arena& scratch);
    // Micro-batch `mb`'s forward and backward as a straight list (embedding, each layer's nodes,
    // output; then the same reversed, weight gradients right after each dgrad), on the calling
    // thread with `ep` for every node. forward_backward() is forward() then backward().
    void forward(int mb, const moe::DispatchComms& comms, Arena& scratch);
    void backward(int mb, const moe::DispatchComms& comms, Arena& scratch);
    void forward_backward(int mb, const moe::DispatchComms& comms, Arena& scratch);
    // A pipeline transfer (schedule::is_pipeline_transfer) of a call's micro-batch: the tensor it
    // moves, x[p] for a forward one and dx[p] for a backward one ((T, H) f32, p = call.layer); a
    // receive acquires it. After the transfer, transfer_done() returns a sent tensor to its pool
    // (the receiving stage holds its own copy).
    Tensor transfer_tensor(const schedule::NodeCall& call);
    void transfer_done(const schedule::NodeCall& call);
    // Micro-batches with a forward begun and a backward not finished.
    int num_in_flight() const;
    // After the step's nodes finished.
    const std::vector<MicroBatchResult>& results() const { return results_; }
    const std::vector<LayerStepStats>& layer_stats() const { return layer_stats_; }

    // Activation bytes in use now / at peak since reset_activation_peak().
    int64_t activation_bytes() const { return meter_.bytes.load(); }
    int64_t peak_activation_bytes() const { return meter_.peak.load(); }
    void reset_activation_peak() { meter_.peak.store(meter_.bytes.load()); }

private:
    // One micro-batch in flight: its states and hand-off tensors, null / undefined outside their
    // lifetimes. Position p's input x[p] lives from the forward that produces it until p's
    // backward is done; dx[p] from p's backward until the position below has consumed it.
    struct MicroBatch {
        std::vector<LayerState*> layers;  // [L]
        OutputState* output = nullptr;
        std::vector<HandoffState*> x, dx;  // [L + 1] each
        // Multi-token prediction: the prologue's activations (from the MTP layer's forward to
        // its state's release), the shifted tokens' embedding e (from the embedding forward to
        // the prologue's backward) and its gradient (from there to the embedding backward).
        MtpState* mtp = nullptr;
        HandoffState* mtp_embed = nullptr;
        HandoffState* d_mtp_embed = nullptr;
        int index = 0;  // the micro-batch's index in the step
    };

    MicroBatch& micro_batch(int mb);
    // Micro-batch mb's calls of one phase as the straight reference runs them.
    std::vector<schedule::NodeCall> straight_calls(int mb, schedule::Phase phase) const;
    LayerState& layer_state(MicroBatch& m, int l);                    // acquires on first use
    Tensor handoff(std::vector<HandoffState*>& slots, int position);  // acquires
    void release_handoff(std::vector<HandoffState*>& slots, int position);
    Tensor fill_slot(HandoffState*& slot, int position);  // acquires a (T, H) f32 hand-off
    void release_slot(HandoffState*& slot);
    void release_slot_locked(HandoffState*& slot);  // slots_mutex_ held
    void release_layer(MicroBatch& m, int l);
    // Full recompute: whether layer l is recomputed / the last layer of its group.
    bool recomputed(int l) const;
    bool last_of_group(int l) const;
    void account(MicroBatch& m);

    void embedding_forward(int mb, MicroBatch& m, const NodeArgs& a);
    void embedding_backward(int mb, MicroBatch& m, const NodeArgs& a);
    // Tensor parallelism: the stream's tp communicator (refuses a missing / wrong-sized one).
    comm::Communicator& tp_comm(const NodeArgs& a) const;
    // Tensor parallelism: fills p (this rank's shard) with rank tp_rank's part of the TP 1
    // weight of shape `full` drawn as init_weights draws it: rows block by block (`blocks`,
    // tensor_parallel.h's tp_copy_row_shard) or, with no blocks, columns.
    void init_normal_shard(Param& p, uint64_t seed, float std, const Shape& full,
                           std::vector<int64_t> blocks) const;
    void output_forward(int mb, MicroBatch& m, Arena& scratch, const NodeArgs& a);
    void output_backward(MicroBatch& m, Arena& scratch, const NodeArgs& a);
    void run_layer(const schedule::NodeCall& c, MicroBatch& m, const NodeArgs& args);
    // Multi-token prediction: the MTP layer's input u (runs the prologue), and the prologue's
    // backward after the layer's pre_dispatch backward wrote st.du.
    Tensor mtp_forward(MicroBatch& m, Arena& scratch);
    void mtp_backward(MicroBatch& m, Arena& scratch);
    void mtp_output_forward(int mb, MicroBatch& m, Arena& scratch);
    // Whether the embedding position looks up the MTP's shifted tokens (one stage); with stages
    // the MTP layer's prologue does, in the last stage's embedding copy.
    bool mtp_lookup_at_embedding() const {
        return shape_.mtp_num_layers > 0 && !shape_.has_embedding_copies();
    }
    void mtp_output_backward(MicroBatch& m, Arena& scratch);

    GptShape shape_;
    std::vector<LayerShape> layer_shapes_;
    RopeTable rope_;
    Param embedding_;
    std::vector<LayerParams> layers_;
    Param final_norm_;
    Param output_;
    MtpParams mtp_;  // with mtp_num_layers = 1
    std::vector<Param*> dense_params_, expert_params_, tp_summed_params_, tp_replicated_params_;
    std::unique_ptr<moe::TokenDispatcher> dispatcher_;  // with MoE layers

    std::vector<MicroBatch> micro_batches_;  // one per micro-batch of the step (grown, kept)
    // Guards every micro-batch's state and hand-off pointers (acquire, release, account): with
    // delayed weight gradients off the chain (schedule.h), a micro-batch's wgrad on the compute
    // stream releases its layer while its next call on the comm stream receives a hand-off or
    // accounts every live state of the micro-batch.
    std::mutex slots_mutex_;
    ActivationMeter meter_;
    StatePool<LayerState> layer_pool_{meter_};
    StatePool<OutputState> output_pool_{meter_};
    StatePool<HandoffState> handoff_pool_{meter_};
    StatePool<MtpState> mtp_pool_{meter_};
    std::vector<std::vector<int32_t>> step_tokens_, step_labels_;
    // Multi-token prediction: each micro-batch's tokens and labels shifted left by one, and the
    // MTP loss's mask (every position but a sequence's last).
    std::vector<std::vector<int32_t>> step_mtp_tokens_, step_mtp_labels_;
    std::vector<uint8_t> mtp_mask_;
    float loss_grad_scale_ = 1.0f;
    std::vector<MicroBatchResult> results_;
    std::vector<LayerStepStats> layer_stats_;
};

}  // namespace epo::model
