// Checkpoint paths checked before a run's first step, on one rank: a load path that is a file, an
// iteration directory without its metadata, a save path that cannot be written; and which
// configuration differences a resume accepts (`--moe_a2a_overlap true` switches the schedule).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "epo/checkpoint/checkpoint.h"
#include "epo/checkpoint/start_checks.h"
#include "epo/config/builder.h"
#include "epo/config/validate.h"
#include "epo/core/error.h"

namespace epo::checkpoint {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
    const fs::path dir =
        fs::temp_directory_path() / ("epo_ckpaths_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

std::string message_of(const std::function<void()>& f, ErrorKind kind) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    return "no error";
}

TEST(CheckpointPaths, LoadNamingAFileIsAUsageError) {
    const fs::path file = fresh_dir("file") / "not_a_dir";
    std::ofstream(file) << "x";
    const std::string m = message_of([&] { find_latest_checkpoint(file); }, ErrorKind::kUsage);
    EXPECT_NE(m.find("is not a directory"), std::string::npos) << m;
}

// An iteration directory whose metadata.json is missing used to restart from iteration 0.
TEST(CheckpointPaths, IterationDirectoryWithoutMetadataIsRefusedNamingTheFile) {
    const fs::path dir = fresh_dir("nometa");
    fs::create_directories(dir / "iter_0000004");
    std::ofstream(dir / "iter_0000004" / "rank_00000.safetensors") << "x";
    std::string m =
        message_of([&] { find_latest_checkpoint(dir / "iter_0000004"); }, ErrorKind::kIo);
    EXPECT_NE(m.find((dir / "iter_0000004" / "metadata.json").string() + "' is missing"),
              std::string::npos)
        << m;
    // The directory holding it, with no complete checkpoint beside it: refused too.
    m = message_of([&] { find_latest_checkpoint(dir); }, ErrorKind::kIo);
    EXPECT_NE(m.find("holds no complete checkpoint"), std::string::npos) << m;
    EXPECT_NE(m.find("metadata.json' is missing"), std::string::npos) << m;
    // An empty directory (a first run of a restartable job) still means "start from 0".
    EXPECT_FALSE(find_latest_checkpoint(fresh_dir("empty")).has_value());
}

TEST(CheckpointPaths, UnwritableSaveIsRefusedNamingFieldValueAndFix) {
    const fs::path file = fresh_dir("savefile") / "a_file";
    std::ofstream(file) << "x";
    for (const fs::path& p : {fs::path("/dev/null"), file, fs::path("/proc/epo_ckpt")}) {
        const std::string m = message_of([&] { check_save_dir_writable(p); }, ErrorKind::kConfig);
        EXPECT_NE(m.find("checkpoint.save = '" + p.string() + "'"), std::string::npos) << m;
        EXPECT_NE(m.find("give checkpoint.save a directory"), std::string::npos) << m;
    }
    const fs::path ok = fresh_dir("saveok") / "nested" / "ckpt";
    EXPECT_NO_THROW(check_save_dir_writable(ok));
    EXPECT_TRUE(fs::is_directory(ok));
    EXPECT_TRUE(fs::is_empty(ok));  // the probe file is gone
}

config::Config finalized(const config::HarnessOverrides& harness) {
    config::ConfigSources sources;
    sources.model = "tiny-moe";
    sources.harness = harness;
    return config::validate(config::build_config(sources)).config;
}

// The overlap switched on the documented way creates comm_overlap and changes
// model.batch_p2p_comm: schedule switches, bit-identical by design, so a resume accepts them.
TEST(CheckpointPaths, ResumeAcceptsTheOverlapSwitchedOnByTheHarnessFlag) {
    const config::Config saved = finalized({});
    config::HarnessOverrides overlap;
    overlap.moe_a2a_overlap = true;
    const config::Config now = finalized(overlap);
    EXPECT_TRUE(resume_config_differences(saved, now).empty())
        << ::testing::PrintToString(resume_config_differences(saved, now));
    EXPECT_TRUE(resume_config_differences(now, saved).empty());
    // A change of the math is still named.
    config::Config other = now;
    other.optimizer.lr *= 2;
    ASSERT_EQ(resume_config_differences(saved, other).size(), 1u);
    EXPECT_EQ(resume_config_differences(saved, other)[0].rfind("optimizer.lr:", 0), 0u);
}

}  // namespace
}  // namespace epo::checkpoint
