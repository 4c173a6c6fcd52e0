// What `epo plan` adds to a plan beside the step times: each schedule's memory against the
// device (gpu_memory.h on a GPU, the epo runtime's estimate on cpu) with what to change when it
// does not fit, and the notes on what the plan approximates or the targets disagree on.
#pragma once

#include "epo/config/config.h"
#include "epo/plan/plan.h"

namespace epo::plan {

// Sets each run's `fits` (the device's memory less r.memory_headroom) and adds a note per
// schedule that does not fit, naming the stage, its parts and the fix.
void check_memory(PlanResult& r, const config::Config& cfg);

// Notes: an uneven pipeline split and how it was planned, full recompute with EP overlap (which
// target allows it), MTP's place, fp8 on a device without an fp8 rate, and on Blackwell with the
// alltoall dispatcher the published runs where overlap did not pay and the plan said it would.
void add_layout_notes(const config::Config& cfg, PlanResult& r);

}  // namespace epo::plan
