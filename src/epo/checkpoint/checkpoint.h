// Checkpoints: what a run needs to continue bit-identically, written so that a crash at any
// moment leaves the previous checkpoint loadable.
//
// On disk (checkpoint.save = DIR):
//   DIR/iter_0000010/                  one complete checkpoint (iteration 10)
//       rank_00000.safetensors         rank 0's tensors (fp32 masters, Adam moments, ...)
//       rank_00001.safetensors
//       metadata.json                  iteration, consumed samples, RNG, layout, finalized
//                                      config, and every rank file's size and SHA-256
//   DIR/iter_0000020.tmp/              a save in progress (or interrupted): never loaded
//   DIR/latest_checkpointed_iteration.txt   the last iteration saved (as Megatron writes it)
//
// Saving (collective): rank 0 makes iter_N.tmp; every rank writes and fsyncs its file, then
// checksums it; rank 0 writes metadata.json, fsyncs the directory, renames iter_N.tmp to iter_N
// and fsyncs DIR. A directory named iter_N (no suffix) with a metadata.json is therefore
// complete, and the loader considers nothing else.
//
// Loading: the latest complete checkpoint in checkpoint.load (or that directory itself when it is
// one). Each rank verifies the layout and its own file (size, SHA-256, safetensors structure)
// before anything is applied; the ranks then agree, so a corrupt file on one rank is refused on
// all of them and nothing is half-loaded.
//
// What this component does not know: which tensors a trainer saves (train/trainer_state.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "epo/comm/communicator.h"
#include "epo/config/config.h"
#include "epo/io/safetensors.h"

namespace epo::checkpoint {

// The job layout a checkpoint belongs to; a checkpoint loads only into the same layout.
struct WorldLayout {
    int world_size = 1;
    int num_nodes = 1;
    int gpus_per_node = 1;
    int expert_model_parallel_size = 1;
    // Each rank's file holds its stage's parameters only, so the pipeline layout is part of the
    // layout (a checkpoint without these fields was saved at PP = 1, VPP unset).
    int pipeline_model_parallel_size = 1;
    int virtual_pipeline_model_parallel_size = 1;
    // Each rank's file holds its tensor-parallel shard of the dense weights and its
    // expert-tensor-parallel shard of the experts; context parallelism reorders the tokens a rank
    // holds. A checkpoint without these fields was saved with all three at 1.
    int tensor_model_parallel_size = 1;
    int expert_tensor_parallel_size = 1;
    int context_parallel_size = 1;

    bool operator==(const WorldLayout&) const = default;
};

WorldLayout world_layout_of(const config::Config& cfg, int world_size);

// Everything about the run besides the tensors.
struct CheckpointInfo {
    int64_t iteration = 0;         // optimizer steps done
    int64_t consumed_samples = 0;  // samples of the global batches done (the data position)
    // Every random number of a run is a pure function of (seed, index): weights of (seed, element),
    // samples of (seed, sample index). The generator state is therefore the seed plus the data
    // position, recorded as such.
    uint64_t seed = 0;
    WorldLayout layout;
    std::string config_yaml;  // the finalized configuration
};

// "iter_0000010".
std::string iteration_dir_name(int64_t iteration);
// "rank_00001.safetensors".
std::string rank_file_name(int rank);

// Collective over `world` (every rank, with its own tensors). Writes
// <save_dir>/iter_<info.iteration> as described above and returns its path. A checkpoint of the
// same iteration already there is replaced. Any rank's failure is thrown on every rank
// (agree_on_success), and the previous checkpoints stay as they were.
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir,
                                      const CheckpointInfo& info,
                                      const std::vector<io::NamedTensor>& tensors,
                                      comm::Communicator& world);

// The newest complete checkpoint under `dir`, or `dir` itself if it is a checkpoint; nullopt when
// `dir` does not exist or holds no iter_* directory. kUsage when `dir` is a file; kIo naming the
// missing metadata.json when `dir` is an iteration directory without one or holds only such (a
// complete checkpoint beside an incomplete newer one is loaded: the loader skips debris). Local:
// every rank calls it at start-up (train_run.cpp), so none waits on another for the verdict.
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& dir);

struct RankCheckpoint {
    CheckpointInfo info;
    io::SafetensorsFile file;  // this rank's tensors, verified
};

// Local (no communication): reads metadata.json and this rank's file, and refuses (epo::Error
// naming the file or the difference, and what to do) a checkpoint of another layout than
// `expected`, a missing/truncated/corrupt file, or one whose checksum does not match.
RankCheckpoint read_rank_checkpoint(const std::filesystem::path& checkpoint_dir, int rank,
                                    const WorldLayout& expected);

// The configuration keys whose values differ between the checkpoint's configuration and `now`,
// as "key: <saved> vs <now>", leaving out the keys a resumed run may change (train.train_iters,
// train.log_interval, checkpoint.*, logger.*, comm timeouts and link model, the overlap schedule
// switches, which do not change the math, and env.*).
std::vector<std::string> resume_config_differences(const config::Config& saved,
                                                   const config::Config& now);

// kConfig listing resume_config_differences() when there are any.
void check_resume_config(const std::string& saved_yaml, const config::Config& now,
                         const std::filesystem::path& checkpoint_dir);

}  // namespace epo::checkpoint
