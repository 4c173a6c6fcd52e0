#include "epo/checkpoint/checkpoint.h"

#include <nlohmann/json.hpp>
#include <regex>

#include "epo/checkpoint/file_io.h"
#include "epo/checkpoint/rank_agreement.h"
#include "epo/config/yaml_io.h"
#include "epo/core/error.h"

namespace epo::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "epo-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kMetadataName = "metadata.json";
constexpr const char* kTrackerName = "latest_checkpointed_iteration.txt";

struct FileRecord {
    std::string name;
    int64_t bytes = 0;
    std::string sha256;
};

json layout_json(const WorldLayout& l) {
    return {{"world_size", l.world_size},
            {"num_nodes", l.num_nodes},
            {"gpus_per_node", l.gpus_per_node},
            {"expert_model_parallel_size", l.expert_model_parallel_size},
            {"pipeline_model_parallel_size", l.pipeline_model_parallel_size},
            {"virtual_pipeline_model_parallel_size", l.virtual_pipeline_model_parallel_size},
            {"tensor_model_parallel_size", l.tensor_model_parallel_size},
            {"expert_tensor_parallel_size", l.expert_tensor_parallel_size},
            {"context_parallel_size", l.context_parallel_size}};
}

std::string metadata_text(const CheckpointInfo& info, const std::vector<FileRecord>& files) {
    json j;
    j["format"] = kFormat;
    j["version"] = kFormatVersion;
    j["iteration"] = info.iteration;
    j["consumed_samples"] = info.consumed_samples;
    j["rng"] = {{"seed", info.seed}, {"next_sample", info.consumed_samples}};
    j["layout"] = layout_json(info.layout);
    j["files"] = json::array();
    for (const FileRecord& f : files)
        j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
    j["config_yaml"] = info.config_yaml;
    return j.dump(2) + "\n";
}

[[noreturn]] void bad_metadata(const fs::path& path, const std::string& what) {
    throw Error(ErrorKind::kIo,
                fmt::format("checkpoint metadata '{}': {}; the checkpoint is damaged: load an "
                            "older one (checkpoint.load=<its iter_* directory>)",
                            path.string(), what));
}

struct Metadata {
    CheckpointInfo info;
    std::vector<FileRecord> files;
};

Metadata read_metadata(const fs::path& dir) {
    const fs::path path = dir / kMetadataName;
    if (!fs::exists(path)) {
        throw Error(ErrorKind::kIo, fmt::format("'{}' is not a complete checkpoint: it has no {}",
                                                dir.string(), kMetadataName));
    }
    const std::vector<std::byte> bytes = read_file_bytes(path);
    json j;
    try {
        j = json::parse(reinterpret_cast<const char*>(bytes.data()),
                        reinterpret_cast<const char*>(bytes.data()) + bytes.size());
    } catch (const json::exception& e) {
        bad_metadata(path, fmt::format("not valid JSON ({})", e.what()));
    }
    Metadata m;
    try {
        if (j.at("format").get<std::string>() != kFormat)
            bad_metadata(path, fmt::format("format is not '{}'", kFormat));
        if (j.at("version").get<int>() != kFormatVersion) {
            bad_metadata(path, fmt::format("format version {} is not {}, the one this build reads",
                                           j.at("version").get<int>(), kFormatVersion));
        }
        m.info.iteration = j.at("iteration").get<int64_t>();
        m.info.consumed_samples = j.at("consumed_samples").get<int64_t>();
        m.info.seed = j.at("rng").at("seed").get<uint64_t>();
        const json& l = j.at("layout");
        m.info.layout = WorldLayout{l.at("world_size").get<int>(),
                                    l.at("num_nodes").get<int>(),
                                    l.at("gpus_per_node").get<int>(),
                                    l.at("expert_model_parallel_size").get<int>(),
                                    l.value("pipeline_model_parallel_size", 1),
                                    l.value("virtual_pipeline_model_parallel_size", 1),
                                    l.value("tensor_model_parallel_size", 1),
                                    l.value("expert_tensor_parallel_size", 1),
                                    l.value("context_parallel_size", 1)};
        m.info.config_yaml = j.at("config_yaml").get<std::string>();
        for (const json& f : j.at("files")) {
            m.files.push_back(FileRecord{f.at("name").get<std::string>(),
                                         f.at("bytes").get<int64_t>(),
                                         f.at("sha256").get<std::string>()});
        }
    } catch (const json::exception& e) {
        bad_metadata(path, fmt::format("missing or mistyped field ({})", e.what()));
    }
    if (static_cast<int>(m.files.size()) != m.info.layout.world_size) {
        bad_metadata(path, fmt::format("{} files listed for a world of {} ranks", m.files.size(),
                                       m.info.layout.world_size));
    }
    return m;
}

std::string layout_differences(const WorldLayout& saved, const WorldLayout& now) {
    std::string diff;
    auto add = [&](const char* name, int a, int b) {
        if (a != b)
            diff += fmt::format("{}{} {} in the checkpoint, {} in this job",
                                diff.empty() ? "" : "; ", name, a, b);
    };
    add("world size", saved.world_size, now.world_size);
    add("comm.num_nodes", saved.num_nodes, now.num_nodes);
    add("comm.gpus_per_node", saved.gpus_per_node, now.gpus_per_node);
    add("model.expert_model_parallel_size", saved.expert_model_parallel_size,
        now.expert_model_parallel_size);
    add("model.pipeline_model_parallel_size", saved.pipeline_model_parallel_size,
        now.pipeline_model_parallel_size);
    add("model.virtual_pipeline_model_parallel_size", saved.virtual_pipeline_model_parallel_size,
        now.virtual_pipeline_model_parallel_size);
    add("model.tensor_model_parallel_size", saved.tensor_model_parallel_size,
        now.tensor_model_parallel_size);
    add("model.expert_tensor_parallel_size", saved.expert_tensor_parallel_size,
        now.expert_tensor_parallel_size);
    add("model.context_parallel_size", saved.context_parallel_size, now.context_parallel_size);
    return diff;
}

// Keys a resumed run may set differently: they steer the run, not the state it continues.
bool may_change_on_resume(std::string_view key) {
    // comm_overlap.*: every key of that section is a communication-schedule switch (which
    // transfers overlap what, how they are batched); the ones that reach the math are mirrored
    // into model.* / ddp.* by finalization and compared there.
    static constexpr std::string_view kPrefixes[] = {"checkpoint.", "logger.", "comm.link.", "env.",
                                                     "comm_overlap."};
    static constexpr std::string_view kKeys[] = {
        "recipe",
        "train.train_iters",
        "train.log_interval",
        "comm.timeout_s",
        // The overlap schedule and delayed wgrad are bit-identical to the baseline (design.md).
        "comm_overlap.overlap_moe_expert_parallel_comm",
        "comm_overlap.delay_wgrad_compute",
        "model.overlap_moe_expert_parallel_comm",
        "model.delay_wgrad_compute",
        // How the schedule issues its point-to-point transfers; the same bytes arrive either way.
        "model.batch_p2p_comm",
        "model.overlap_p2p_comm",
        "ddp.delay_wgrad_compute",
        // Bucketed reduction and the distributed optimizer give the same sums and updates, and
        // checkpoints hold whole tensors either way (train/trainer.h).
        "ddp.use_distributed_optimizer",
        "ddp.overlap_grad_reduce",
        "ddp.overlap_param_gather",
        "ddp.bucket_size",
        "comm_overlap.overlap_grad_reduce",
        "comm_overlap.overlap_param_gather",
        "comm_overlap.bucket_size",
    };
    for (std::string_view p : kPrefixes) {
        if (key.substr(0, p.size()) == p)
            return true;
    }
    for (std::string_view k : kKeys) {
        if (key == k)
            return true;
    }
    return false;
}

void replace_dir(const fs::path& from, const fs::path& to) {
    if (fs::exists(to)) {
        // Re-saving an iteration (e.g. a resumed run that ends where it started): move the old
        // one aside first; rename() cannot replace a non-empty directory.
        const fs::path old = to.string() + ".old";
        fs::remove_all(old);
        fs::rename(to, old);
        fs::rename(from, to);
        fs::remove_all(old);
    } else {
        fs::rename(from, to);
    }
}

}  // namespace

WorldLayout world_layout_of(const config::Config& cfg, int world_size) {
    return WorldLayout{
        .world_size = world_size,
        .num_nodes = config::num_nodes(cfg.comm),
        .gpus_per_node = config::gpus_per_node(cfg.comm),
        .expert_model_parallel_size = cfg.model.expert_model_parallel_size,
        .pipeline_model_parallel_size = cfg.model.pipeline_model_parallel_size,
        .virtual_pipeline_model_parallel_size = config::virtual_pipeline_size(cfg.model),
        .tensor_model_parallel_size = cfg.model.tensor_model_parallel_size,
        .expert_tensor_parallel_size = config::expert_tensor_parallel_size(cfg.model),
        .context_parallel_size = cfg.model.context_parallel_size};
}

std::string iteration_dir_name(int64_t iteration) {
    return fmt::format("iter_{:07d}", iteration);
}

std::string rank_file_name(int rank) {
    return fmt::format("rank_{:05d}.safetensors", rank);
}

fs::path save_checkpoint(const fs::path& save_dir, const CheckpointInfo& info,
                         const std::vector<io::NamedTensor>& tensors, comm::Communicator& world) {
    const int rank = world.rank();
    const fs::path final_dir = save_dir / iteration_dir_name(info.iteration);
    const fs::path tmp_dir = final_dir.string() + ".tmp";
    auto attempt = [](auto&& work) {
        try {
            work();
        } catch (const fs::filesystem_error& e) {
            return std::make_exception_ptr(Error(ErrorKind::kIo, e.what()));
        } catch (...) {
            return std::current_exception();
        }
        return std::exception_ptr();
    };

    // 1. Rank 0 prepares an empty temporary directory (a leftover of an interrupted save of the
    //    same iteration is discarded).
    std::exception_ptr failure;
    if (rank == 0) {
        failure = attempt([&] {
            fs::create_directories(save_dir);
            fs::remove_all(tmp_dir);
            fs::create_directory(tmp_dir);
        });
    }
    agree_on_success(world, failure);

    // 2. Every rank writes, syncs and checksums its own file.
    FileRecord record{.name = rank_file_name(rank)};
    failure = attempt([&] {
        const fs::path path = tmp_dir / record.name;
        io::write_safetensors(path.string(), tensors,
                              {{"format", kFormat},
                               {"iteration", std::to_string(info.iteration)},
                               {"rank", std::to_string(rank)},
                               {"world_size", std::to_string(world.size())}});
        fsync_path(path);
        const std::vector<std::byte> bytes = read_file_bytes(path);
        record.bytes = static_cast<int64_t>(bytes.size());
        record.sha256 = sha256_hex(bytes);
    });
    agree_on_success(world, failure);
    const std::vector<std::string> digests = all_gather_strings(world, record.sha256);
    std::vector<int64_t> sizes(static_cast<size_t>(world.size()));
    world.all_gather(std::span<const int64_t>(&record.bytes, 1), std::span<int64_t>(sizes));

    // 3. Rank 0 completes it: metadata, sync, rename, sync of the parent.
    if (rank == 0) {
        failure = attempt([&] {
            std::vector<FileRecord> files;
            for (int r = 0; r < world.size(); ++r)
                files.push_back({rank_file_name(r), sizes[r], digests[r]});
            write_file_durably(tmp_dir / kMetadataName, metadata_text(info, files));
            fsync_path(tmp_dir);
            replace_dir(tmp_dir, final_dir);
            fsync_path(save_dir);
            write_file_durably(save_dir / kTrackerName, std::to_string(info.iteration) + "\n");
        });
    }
    agree_on_success(world, failure);
    return final_dir;
}

std::optional<fs::path> find_latest_checkpoint(const fs::path& dir) {
    if (!fs::exists(dir))
        return std::nullopt;
    if (!fs::is_directory(dir)) {
        throw Error(ErrorKind::kUsage,
                    fmt::format("checkpoint.load = '{}' is not a directory; give the directory "
                                "checkpoints were saved to (checkpoint.save) or one iter_* "
                                "directory in it",
                                dir.string()));
    }
    if (fs::exists(dir / kMetadataName))
        return dir;
    static const std::regex kName("iter_([0-9]+)");
    const fs::path self = dir.filename().empty() ? dir.parent_path() : dir;
    const bool holds_rank_files = fs::exists(dir / rank_file_name(0));
    if (std::regex_match(self.filename().string(), kName) || holds_rank_files) {
        // An iteration directory without its metadata: damaged or copied in part. Starting from
        // iteration 0 instead would silently throw the run's work away.
        throw Error(ErrorKind::kIo,
                    fmt::format("checkpoint.load = '{}' is not a complete checkpoint: '{}' is "
                                "missing; point checkpoint.load at a complete iter_* directory "
                                "(one with a {}) or at the directory holding them",
                                dir.string(), (dir / kMetadataName).string(), kMetadataName));
    }
    std::optional<fs::path> best;
    std::optional<fs::path> incomplete;  // the newest iter_* directory without metadata
    int64_t best_iteration = -1;
    int64_t incomplete_iteration = -1;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
        std::smatch m;
        const std::string name = entry.path().filename().string();
        if (!entry.is_directory() || !std::regex_match(name, m, kName))
            continue;
        const int64_t iteration = std::stoll(m[1].str());
        if (!fs::exists(entry.path() / kMetadataName)) {
            if (iteration > incomplete_iteration) {
                incomplete_iteration = iteration;
                incomplete = entry.path();
            }
            continue;
        }
        if (iteration > best_iteration) {
            best_iteration = iteration;
            best = entry.path();
        }
    }
    if (!best && incomplete) {
        throw Error(ErrorKind::kIo,
                    fmt::format("checkpoint.load = '{}' holds no complete checkpoint: '{}' is "
                                "missing (a damaged or partly copied checkpoint); restore it, "
                                "or start a new run without checkpoint.load",
                                dir.string(), (*incomplete / kMetadataName).string()));
    }
    return best;
}

RankCheckpoint read_rank_checkpoint(const fs::path& checkpoint_dir, int rank,
                                    const WorldLayout& expected) {
    Metadata meta = read_metadata(checkpoint_dir);
    const std::string diff = layout_differences(meta.info.layout, expected);
    if (!diff.empty()) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("checkpoint '{}' was saved by a job of another layout ({}); resume "
                                "with the layout it was saved with, or start a new run without "
                                "checkpoint.load",
                                checkpoint_dir.string(), diff));
    }
    const FileRecord& record = meta.files.at(static_cast<size_t>(rank));
    const fs::path path = checkpoint_dir / record.name;
    if (record.name != rank_file_name(rank)) {
        bad_metadata(checkpoint_dir / kMetadataName,
                     fmt::format("rank {}'s file is listed as '{}'", rank, record.name));
    }
    if (!fs::exists(path)) {
        throw Error(ErrorKind::kIo, fmt::format("checkpoint file '{}' is missing; the checkpoint "
                                                "is incomplete: load an older one",
                                                path.string()));
    }
    const std::vector<std::byte> bytes = read_file_bytes(path);
    const std::string digest = sha256_hex(bytes);
    // A file whose size and SHA-256 match another rank's record is that rank's file under this
    // rank's name (swapped or renamed by hand), not a truncated or corrupt one: say so.
    if (static_cast<int64_t>(bytes.size()) != record.bytes || digest != record.sha256) {
        for (size_t r = 0; r < meta.files.size(); ++r) {
            if (static_cast<int>(r) != rank &&
                meta.files[r].bytes == static_cast<int64_t>(bytes.size()) &&
                meta.files[r].sha256 == digest) {
                throw Error(ErrorKind::kIo,
                            fmt::format("checkpoint file '{}' holds rank {}'s state (its size and "
                                        "SHA-256 are those saved for '{}'): the rank files were "
                                        "swapped or renamed; give each its saved name back, or "
                                        "load an older checkpoint",
                                        path.string(), r, meta.files[r].name));
            }
        }
    }
    if (static_cast<int64_t>(bytes.size()) != record.bytes) {
        throw Error(ErrorKind::kIo,
                    fmt::format("checkpoint file '{}' has {} bytes, {} when it was saved: it is "
                                "truncated or was overwritten; load an older checkpoint",
                                path.string(), bytes.size(), record.bytes));
    }
    if (digest != record.sha256) {
        throw Error(ErrorKind::kIo,
                    fmt::format("checkpoint file '{}' is corrupt: its SHA-256 is {}, {} when it "
                                "was saved; load an older checkpoint",
                                path.string(), digest, record.sha256));
    }
    RankCheckpoint out{.info = std::move(meta.info), .file = io::parse_safetensors(bytes, path)};
    const auto& md = out.file.metadata;
    auto field = [&](const char* key) {
        auto it = md.find(key);
        return it == md.end() ? std::string("(none)") : it->second;
    };
    if (field("rank") != std::to_string(rank) ||
        field("iteration") != std::to_string(out.info.iteration)) {
        throw Error(ErrorKind::kIo,
                    fmt::format("checkpoint file '{}' belongs to rank {} at iteration {}, not to "
                                "rank {} at iteration {}: files of different checkpoints were "
                                "mixed; load an intact checkpoint",
                                path.string(), field("rank"), field("iteration"), rank,
                                out.info.iteration));
    }
    return out;
}

std::vector<std::string> resume_config_differences(const config::Config& saved,
                                                   const config::Config& now) {
    // `--moe_a2a_overlap true` creates the comm_overlap section; a section present on one side
    // only would compare as one opaque difference, so compare it key by key against an empty one.
    config::Config a = saved;
    config::Config b = now;
    if (a.comm_overlap.has_value() != b.comm_overlap.has_value())
        (a.comm_overlap ? b : a).comm_overlap.emplace();
    std::vector<std::string> out;
    for (std::string& d : config::diff_configs(a, b)) {
        const std::string key = d.substr(0, d.find(':'));
        if (!may_change_on_resume(key))
            out.push_back(std::move(d));
    }
    return out;
}

void check_resume_config(const std::string& saved_yaml, const config::Config& now,
                         const fs::path& checkpoint_dir) {
    const config::Config saved = config::config_from_yaml(
        saved_yaml, config::YamlSource{(checkpoint_dir / kMetadataName).string() + " config_yaml"});
    const std::vector<std::string> diff = resume_config_differences(saved, now);
    if (diff.empty())
        return;
    std::string lines;
    for (const std::string& d : diff)
        lines += "\n  " + d + " (checkpoint vs now)";
    throw Error(ErrorKind::kConfig,
                fmt::format("checkpoint '{}' was saved with a different configuration; these "
                            "settings differ:{}\nresume with the checkpoint's values (its "
                            "metadata.json holds the configuration), or start a new run without "
                            "checkpoint.load",
                            checkpoint_dir.string(), lines));
}

}  // namespace epo::checkpoint
