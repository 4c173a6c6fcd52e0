// `epo`: the command line. Parses the subcommand and hands over to the library; turns an
// epo::Error into a message on stderr and the exit status of its kind (2 usage, 1 otherwise),
// suggests the closest subcommand or flag for a mistyped one, and with --json writes an error as
// a JSON object on stdout (so a script reading the JSON output always gets JSON).
#include <cctype>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <system_error>

#include "commands.h"
#include "epo/core/error.h"
#include "harness_flags.h"
#include "suggest.h"

namespace epo::cli {

std::vector<std::string> normalize_harness_flags(std::vector<std::string> args) {
    for (auto& arg : args) {
        for (const std::string& f : short_harness_flags()) {
            if (arg == f || arg.rfind(f + "=", 0) == 0) {
                arg = "-" + arg;
                break;
            }
        }
    }
    return args;
}

namespace {

std::vector<std::string> subcommand_names(const CLI::App& app) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        names.push_back(sub->get_name());
    return names;
}

// "--max_steps", "-ep", "--expert-model-parallel-size", ... of one subcommand, as a user types
// them (the multi-letter one-dash harness flags with one dash).
std::vector<std::string> flag_names(const CLI::App& sub) {
    const auto& shorts = short_harness_flags();
    std::vector<std::string> names;
    const auto add = [&](const CLI::Option* o) {
        for (const std::string& n : o->get_lnames()) {
            const bool one_dash = std::find(shorts.begin(), shorts.end(), "-" + n) != shorts.end();
            names.push_back((one_dash ? "-" : "--") + n);
        }
        for (const std::string& n : o->get_snames())
            names.push_back("-" + n);
    };
    for (const CLI::Option* o : sub.get_options())
        add(o);
    for (const CLI::App* group : sub.get_subcommands([](const CLI::App* a) {
             return a->get_name().empty();  // option groups (the Megatron-LM flags)
         })) {
        for (const CLI::Option* o : group->get_options())
            add(o);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
}

// The vocabulary a typed flag belongs to: Megatron-LM's dashed names (`--num-layers`), the
// harness's long names (`--num_layers`), or one-dash short names (`-ep`, `-g`).
enum class FlagStyle { kDashed, kLong, kShort };

FlagStyle flag_style(const std::string& flag) {
    if (flag.rfind("--", 0) != 0)
        return FlagStyle::kShort;
    return flag.find('-', 2) != std::string::npos ? FlagStyle::kDashed : FlagStyle::kLong;
}

// The closest known flag, looked for first among the flags of the typed one's style, so that a
// mistyped `--expert-model-paralel-size` is answered in Megatron-LM's spelling and `-ngg` with
// `-ng`; any flag when none of its style is close.
std::optional<std::string> closest_flag(const std::string& typed,
                                        const std::vector<std::string>& flags) {
    std::vector<std::string> same_style;
    for (const std::string& f : flags)
        if (flag_style(f) == flag_style(typed))
            same_style.push_back(f);
    if (auto best = closest_name(typed, same_style))
        return best;
    return closest_name(typed, flags);
}

struct Failure {
    std::string kind;  // "usage error", "I/O error", ...
    std::string message;
    int status = 1;
};

// Errors that are not epo::Error still have a kind the user can act on: a file system call that
// failed is an I/O error, memory that ran out is the machine's limit, not a bug in epo.
Failure classify(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const Error& e) {
        return {error_kind_name(e.kind()), e.what(), exit_status_for(e.kind())};
    } catch (const std::filesystem::filesystem_error& e) {
        return {error_kind_name(ErrorKind::kIo), e.what(), 1};
    } catch (const std::bad_alloc&) {
        return {"out of memory",
                "an allocation failed: the run needs more memory than this machine gives it "
                "(epo validate prints the estimate; shrink the model or the batch)",
                1};
    } catch (const std::system_error& e) {
        return {"system error", e.what(), 1};
    } catch (const std::exception& e) {
        return {error_kind_name(ErrorKind::kInternal), e.what(), 1};
    }
}

int report(const Failure& f, bool json) {
    if (json) {
        const nlohmann::json j = {{"ok", false},
                                  {"error", {{"kind", f.kind}, {"message", f.message}}}};
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        std::fprintf(stderr, "epo: %s: %s\n", f.kind.c_str(), f.message.c_str());
    }
    return f.status;
}

// A usage error CLI11 reports without a hint: an unknown subcommand, unknown flags.
std::optional<std::string> hint_for(const CLI::App& app, const std::vector<std::string>& args) {
    const std::vector<std::string> subs = subcommand_names(app);
    if (args.empty() || args[0].rfind('-', 0) == 0)
        return std::nullopt;
    if (std::find(subs.begin(), subs.end(), args[0]) == subs.end()) {
        const auto best = closest_name(args[0], subs);
        return fmt::format("unknown subcommand '{}'{}; the subcommands are {}", args[0],
                           best ? fmt::format(" (did you mean '{}'?)", *best) : "",
                           fmt::format("{}", fmt::join(subs, ", ")));
    }
    const CLI::App* sub = app.get_subcommand(args[0]);
    const std::vector<std::string> flags = flag_names(*sub);
    std::vector<std::string> hints;
    for (size_t i = 1; i < args.size(); ++i) {
        const std::string flag = args[i].substr(0, args[i].find('='));
        const bool number = flag.size() > 1 && (std::isdigit(static_cast<unsigned char>(flag[1])) ||
                                                flag[1] == '.');  // a value such as -1
        const bool known = std::find(flags.begin(), flags.end(), flag) != flags.end() ||
                           (flag.rfind("--", 0) == 0 &&  // `-tp` after normalize_harness_flags
                            std::find(flags.begin(), flags.end(), flag.substr(1)) != flags.end());
        if (flag.rfind('-', 0) != 0 || number || known)
            continue;
        if (const auto best = closest_flag(flag, flags))
            hints.push_back(fmt::format("unknown flag {} (did you mean {}?)", flag, *best));
    }
    if (hints.empty())
        return std::nullopt;
    return fmt::format("{}", fmt::join(hints, "; "));
}

}  // namespace
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
    epo::cli::add_plan_command(app);

    std::vector<std::string> args(argv + 1, argv + argc);
    args = epo::cli::normalize_harness_flags(args);
    // `epo launch PROGRAM ARGS...` hands the rest to PROGRAM: only its own flags are epo's.
    const bool json = (args.empty() || args[0] != "launch") &&
                      std::find(args.begin(), args.end(), "--json") != args.end();
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
    try {
        app.parse(reversed);
    } catch (const CLI::RuntimeError& e) {
        return e.get_exit_code();  // a subcommand's own verdict (e.g. 1: invalid configuration)
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0)
            return app.exit(e);  // --help / --version
        if (const auto hint = epo::cli::hint_for(app, args))
            return epo::cli::report({"usage error", *hint, 2}, json);
        if (json)
            return epo::cli::report({"usage error", e.what(), 2}, json);
        app.exit(e);
        return 2;  // bad flags are usage errors
    } catch (...) {
        return epo::cli::report(epo::cli::classify(std::current_exception()), json);
    }
    return 0;
}
