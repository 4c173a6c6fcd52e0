// A checksum of a run's final parameters, so that two runs can be judged bit-identical in their
// weights without writing them out (epo bench, epo check-run):
//
//   rank hash  h_r = FNV-1a 64 over every parameter's fp32 master bytes, in
//                    GptModel::all_params() order (dense, then this rank's experts)
//   checksum       = FNV-1a 64 over (h_0, h_1, ..., h_{N-1}) as bytes, ranks in order
//
// after Trainer::sync_params(), so the distributed optimizer's shards are whole on every rank.
// Not a cryptographic hash: it guards against a wrong run, not a malicious one.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "epo/train/trainer.h"

namespace epo::train {

// FNV-1a 64 of `n` bytes, continuing from `hash` (the offset basis to start).
inline constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t hash = kFnvOffsetBasis);

// "fnv1a64:" and 16 hex digits, the same on every rank. Collective over `comm` (the trainer's
// ranks, every rank between steps); a gather that outlives `timeout_s` (comm.timeout_s) ends the
// job (comm::watched_world_call).
std::string final_param_checksum(Trainer& trainer, double timeout_s,
                                 MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace epo::train
