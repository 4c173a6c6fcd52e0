// `epo`: the command line. Parses the subcommand and hands over to the library; turns an
// epo::Error into a message on stderr and the exit status of its kind (2 usage, 1 otherwise).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "epo/core/error.h"

namespace epo::cli {

std::vector<std::string> normalize_harness_flags(std::vector<std::string> args) {
    static const char* const kShortHarnessFlags[] = {"-tp", "-pp", "-vp", "-ep", "-etp",
                                                     "-cp", "-gb", "-mb", "-sl"};
    for (auto& arg : args) {
        for (const char* flag : kShortHarnessFlags) {
            const std::string f = flag;
            if (arg == f || arg.rfind(f + "=", 0) == 0) {
                arg = "-" + arg;
                break;
            }
        }
    }
    return args;
}

}  // namespace epo::cli

int main(int argc, char** argv) {
    CLI::App app{"EPO: expert-parallel communication overlap for Mixture-of-Experts training",
                 "epo"};
    app.set_version_flag("--version", std::string("epo ") + EPO_VERSION);
    app.require_subcommand(1);
    epo::cli::add_validate_command(app);
    epo::cli::add_moe_layer_command(app);
    epo::cli::add_launch_command(app);
    epo::cli::add_train_command(app);
    epo::cli::add_bench_command(app);
    epo::cli::add_check_run_command(app);

    std::vector<std::string> args(argv + 1, argv + argc);
    args = epo::cli::normalize_harness_flags(args);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
    try {
        app.parse(reversed);
    } catch (const CLI::RuntimeError& e) {
        return e.get_exit_code();  // a subcommand's own verdict (e.g. 1: invalid configuration)
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;  // --help / --version exit 0, bad flags are usage errors
    } catch (const epo::Error& e) {
        std::fprintf(stderr, "epo: %s: %s\n", epo::error_kind_name(e.kind()), e.what());
        return epo::exit_status_for(e.kind());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "epo: internal error: %s\n", e.what());
        return 1;
    }
    return 0;
}
