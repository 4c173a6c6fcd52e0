// Helpers for checkpoint tests: a temporary directory every rank of a job shares, and the small
// model configuration the multi-rank tests train.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace epo::testing {

// A fresh directory named by rank 0 (its pid and `name`), the same path on every rank.
inline std::filesystem::path shared_temp_dir(const std::string& name) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long pid = getpid();
    MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("epo_ckpt_" + std::to_string(pid) + "_" + name);
    if (rank == 0) {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return dir;
}

// tiny-moe shrunk to run a step in tens of milliseconds, EP over the whole world, with a
// sigmoid router and an expert bias that moves fast (so a bias that is not restored shows).
inline std::vector<std::string> small_moe(int world, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {"model.num_layers=2",
                                  "model.hidden_size=64",
                                  "model.kv_channels=16",
                                  "model.ffn_hidden_size=128",
                                  "model.moe_ffn_hidden_size=64",
                                  "model.seq_length=32",
                                  "model.moe_router_score_function=sigmoid",
                                  "model.moe_router_enable_expert_bias=true",
                                  "model.moe_router_bias_update_rate=0.05",
                                  "train.micro_batch_size=2",
                                  "train.global_batch_size=" + std::to_string(2 * world * 2),
                                  "comm.gpus_per_node=" + std::to_string(world),
                                  "model.expert_model_parallel_size=" + std::to_string(world)};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

// Flips one byte in the middle of a file.
inline void flip_byte(const std::filesystem::path& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<long>(f.tellg());
    f.seekg(size / 2);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5A);
    f.seekp(size / 2);
    f.write(&c, 1);
}

}  // namespace epo::testing
