// `epo check-run DIR`: applies the success criteria to a finished `epo bench` run directory and
// prints a verdict per criterion; exit status 0 when every criterion passes, 1 otherwise.
#include <iostream>
#include <memory>

#include "commands.h"
#include "epo/bench/check_run.h"
#include "epo/core/error.h"

namespace epo::cli {

void add_check_run_command(CLI::App& app) {
    auto dir = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "check-run",
        "Check a finished `epo bench` run directory: configuration finalized, overlap flags on, "
        "every step completed, no hang, losses, grad norms and final parameters bit-identical to "
        "the baseline, throughput not "
        "reduced. Exit status 0 only if all pass.");
    cmd->add_option("run_dir", *dir, "the run directory (epo bench --out)")->required();
    cmd->callback([dir] {
        if (!std::filesystem::is_directory(*dir)) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("'{}' is not a directory; give the run directory epo bench "
                                    "printed at its end",
                                    *dir));
        }
        const auto criteria = bench::check_run_dir(*dir);
        std::cout << bench::format_verdicts(criteria);
        for (const auto& c : criteria) {
            if (!c.pass) {
                throw CLI::RuntimeError(1);
            }
        }
    });
}

}  // namespace epo::cli
