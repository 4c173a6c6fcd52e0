// Checks of the checkpoint paths that a run makes at start-up, before the trainer allocates
// anything and before the first step, so that a path that cannot work is refused within seconds
// instead of at the first save (losing the run's work) or after comm.timeout_s.
//
// Local (no communication): every rank calls them on its own and the caller agrees on the
// outcome (rank_agreement.h), so no rank waits on another to learn a verdict.
#pragma once

#include <filesystem>

namespace epo::checkpoint {

// checkpoint.save: creates `dir` and writes a probe file in it. kConfig naming the field, the
// value and the fix when it is a file or a device (/dev/null), cannot be created, or is not
// writable (permission bits do not tell: root ignores them, a read-only mount ignores root).
void check_save_dir_writable(const std::filesystem::path& dir);

}  // namespace epo::checkpoint
