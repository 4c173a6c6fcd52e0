// What `epo plan` validates against: the GPU stack env.gpu names, with the reference's rules
// (config/validate.h), never what the epo CPU runtime happens to execute. The runtime's gaps
// (the RT ids of config/runtime_support.h) stop `epo train` and `epo bench`; for a plan they only
// mean that this machine cannot run the configuration to check the plan, so they become one note.
//
// Deliberately not done here: any rule of the reference (those stay errors and warnings as
// `epo validate` reports them).
#pragma once

#include <string>
#include <vector>

#include "epo/config/report.h"

namespace epo::plan {

// What the epo CPU runtime cannot run of a configuration: its RT ids and the one note that
// names them ("" and none when it can run it all).
struct RuntimeGaps {
    std::vector<std::string> ids;
    std::string note;
};

// The RT ids the report's warnings carried, moved into one note:
//   "the epo runtime cannot run this configuration to check the plan on CPU (RT001, RT005): ..."
// A plan for a GPU (env.gpu other than cpu) also drops the epo runtime's start-up notes (EP005's
// MPI thread level), which say nothing about a GPU stack. Returns the RT ids moved and the note.
RuntimeGaps retarget_for_plan(config::ValidationReport& report);

}  // namespace epo::plan
