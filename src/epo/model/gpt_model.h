// The GPT-style MoE model: token embedding, L transformer layers (dense or MoE per the layer
// pattern), final RMSNorm, output layer and cross-entropy loss, executed node by node.
//
//   forward:  x0 = embed(tokens); x_{l+1} = layer_l(x_l); loss = CE(Wout norm(x_L), labels)
//   backward: the same list reversed; every weight gradient accumulates into its main_grad
//
// The model runs one schedule::NodeCall at a time (run()), on whichever stream the schedule
// put it; it keeps each micro-batch's activations in its own states, so the overlap schedule can
// have two micro-batches in flight through one set of weights. Activation memory is taken from
// pools as a layer's forward starts and given back when its backward is done; the pools report
// the bytes in use and their peak (the "peak activation bytes" metric).
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
#include "epo/model/transformer_layer.h"
#include "epo/schedule/schedule.h"

namespace epo::config {
struct Config;
}

namespace epo::model {

struct GptShape {
    int64_t num_layers = 0;
    int64_t hidden = 0;
    int64_t vocab = 0;
    int64_t seq_length = 0;
    int64_t micro_batch_size = 1;
    AttentionShape attn;
    float norm_eps = 1e-6f;
    double rotary_base = 10000.0;
    float init_std = 0.02f;
    int64_t ffn_hidden = 0;
    std::vector<bool> moe_layers;  // [L]
    moe::MoeConfig moe;
    int ep_size = 1;
    int ep_rank = 0;
    bool tie_embeddings = false;
    bool gradient_accumulation_fusion = false;
    DType compute_dtype = DType::kBF16;

    int64_t tokens() const { return micro_batch_size * seq_length; }
    int64_t num_local_experts() const { return moe.num_experts / ep_size; }
};

// The model shape a finalized configuration describes, for this rank's place in the EP group.
GptShape gpt_shape_from_config(const config::Config& cfg, int ep_size, int ep_rank);

// Activations of one micro-batch after the last layer: the final norm and the loss head.
struct OutputState {
    Arena arena{"output activations"};
    size_t reported_bytes = 0;
    Tensor x;       // (T, H) f32 output of the last layer
    Tensor normed;  // (T, H) compute dtype
    Tensor rstd;    // (T) f32
    LmHeadContext head;
    Tensor d_normed;  // (T, H) f32 gradient of the final-norm output
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
    double lm_loss = 0;  // mean cross-entropy over the micro-batch's tokens
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
    // The parameters at one model position (schedule.h: -1 the embedding, 0..L-1 the layers, L
    // the final norm and output layer), whose gradients are final once the last micro-batch's
    // backward has passed that position. With tied embeddings the output layer's weight is the
    // embedding's (position -1).
    struct PositionParams {
        std::vector<Param*> dense, expert;
    };
    PositionParams params_at(int position);
    LayerParams& layer(int l) { return layers_[static_cast<size_t>(l)]; }

    // Before issuing a step: the step's micro-batches (tokens and labels, T each) and the factor
    // each loss gradient carries (1 / number of micro-batches).
    void begin_step(std::vector<std::vector<int32_t>> tokens,
                    std::vector<std::vector<int32_t>> labels, float loss_grad_scale);
    // Executes one node call. `ep` is the EP communicator of the stream it runs on, `scratch`
    // that stream's scratch arena.
    void run(const schedule::NodeCall& call, comm::Communicator& ep, Arena& scratch);
    // After the step's nodes finished.
    const std::vector<MicroBatchResult>& results() const { return results_; }
    const std::vector<LayerStepStats>& layer_stats() const { return layer_stats_; }

    // Activation bytes in use now / at peak since reset_activation_peak().
    int64_t activation_bytes() const { return meter_.bytes.load(); }
    int64_t peak_activation_bytes() const { return meter_.peak.load(); }
    void reset_activation_peak() { meter_.peak.store(meter_.bytes.load()); }

private:
    struct MicroBatch {
        std::vector<LayerState*> layers;  // [L], null outside the layer's lifetime
        OutputState* output = nullptr;
        Tensor grad[2];  // (T, H) f32: layer l reads grad[(l+1)%2], writes grad[l%2]
    };

    MicroBatch& micro_batch(int mb);
    LayerState& layer_state(MicroBatch& m, int l);  // acquires on first use
    Tensor layer_output(MicroBatch& m, int l);      // x of layer l+1, or the output state's x
    void finish_layer_output(MicroBatch& m, int l);
    void final_norm_backward(MicroBatch& m, Arena& scratch);
    void release_layer(MicroBatch& m, int l);
    void account(MicroBatch& m, int l);

    void embedding_forward(int mb, MicroBatch& m);
    void embedding_backward(int mb, MicroBatch& m);
    void output_forward(int mb, MicroBatch& m, Arena& scratch);
    void output_backward(MicroBatch& m, Arena& scratch);
    void run_layer(const schedule::NodeCall& c, MicroBatch& m, const NodeArgs& args);

    GptShape shape_;
    std::vector<LayerShape> layer_shapes_;
    RopeTable rope_;
    Param embedding_;
    std::vector<LayerParams> layers_;
    Param final_norm_;
    Param output_;
    std::vector<Param*> dense_params_, expert_params_;

    std::vector<MicroBatch> slots_;  // two: at most two micro-batches are ever in flight
    ActivationMeter meter_;
    StatePool<LayerState> layer_pool_{meter_};
    StatePool<OutputState> output_pool_{meter_};
    std::vector<std::vector<int32_t>> step_tokens_, step_labels_;
    float loss_grad_scale_ = 1.0f;
    std::vector<MicroBatchResult> results_;
    std::vector<LayerStepStats> layer_stats_;
};

}  // namespace epo::model
