// `epo launch -n N [--omp-threads T] [--mpiexec PATH] [--dry-run] PROGRAM [ARGS...]`: runs PROGRAM
// on N MPI ranks through the launcher of the MPI library epo was built with, with the flags a
// small machine needs (as root, more ranks than cores) and OMP_NUM_THREADS per rank. See
// epo/comm/launch.h; scripts/epo-mpirun is the same command.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "epo/comm/launch.h"
#include "epo/core/error.h"

namespace epo::cli {

void add_launch_command(CLI::App& app) {
    auto* sub = app.add_subcommand(
        "launch",
        "Run a program on N MPI ranks (works as root and with more ranks than cores; sets "
        "OMP_NUM_THREADS per rank)");
    auto options = std::make_shared<comm::LaunchOptions>();
    auto dry_run = std::make_shared<bool>(false);
    sub->add_option("-n,--np", options->num_ranks, "number of ranks")->required();
    sub->add_option("--omp-threads", options->omp_threads,
                    "OpenMP threads per rank (default: OMP_NUM_THREADS if set, else cores / "
                    "ranks, at least 1)");
    sub->add_option("--mpiexec", options->mpiexec,
                    "launcher to use (default: the one of the MPI library epo is linked with)");
    sub->add_option("--hosts", options->hosts,
                    "hosts and their slots, e.g. a:2,b:2 (Open MPI -H, MPICH -hosts; default: "
                    "this machine)");
    sub->add_flag("--dry-run", *dry_run, "print the launcher command line instead of running it");
    // Everything from the first positional argument on is the program and its own arguments.
    sub->prefix_command();
    sub->footer("Example: epo launch -n 4 epo train --model tiny-moe -ep 4");
    sub->callback([sub, options, dry_run] {
        options->command = sub->remaining();
        // prefix_command() also hands over unknown options seen before the program.
        if (!options->command.empty() && options->command.front().rfind('-', 0) == 0) {
            throw Error(ErrorKind::kUsage,
                        fmt::format("epo launch: unknown option {}: name the program right after "
                                    "launch's own options (-n, --omp-threads, --mpiexec, "
                                    "--hosts, --dry-run)",
                                    options->command.front()));
        }
        const auto argv = comm::make_launch_command(*options);
        if (*dry_run) {
            std::string line;
            for (const auto& a : argv)
                line += (line.empty() ? "" : " ") + a;
            std::printf("%s\n", line.c_str());
            return;
        }
        std::fflush(stdout);
        if (const int status =
                comm::run_launch_forwarding(argv, comm::kLauncherFailureGraceS,
                                            comm::rank_hosts(options->hosts, options->num_ranks));
            status != 0)
            throw CLI::RuntimeError(status);
    });
}

}  // namespace epo::cli
