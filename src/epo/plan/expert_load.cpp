#include "epo/plan/expert_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>

#include "epo/core/error.h"
#include "epo/io/files.h"

namespace epo::plan {

std::vector<LayerExpertLoad> expert_load(const std::vector<std::vector<int64_t>>& counts,
                                         int ep_size, int num_ep_groups, int64_t num_steps) {
    std::vector<LayerExpertLoad> out;
    const int ep = std::max(1, ep_size);
    const double per = static_cast<double>(std::max<int64_t>(1, num_steps)) *
                       static_cast<double>(std::max(1, num_ep_groups));
    for (size_t l = 0; l < counts.size(); ++l) {
        const std::vector<int64_t>& c = counts[l];
        if (c.empty())
            continue;
        EPO_CHECK(c.size() % static_cast<size_t>(ep) == 0,
                  "layer {}: {} experts do not split over {} EP ranks", l, c.size(), ep);
        const size_t local = c.size() / static_cast<size_t>(ep);
        LayerExpertLoad layer;
        layer.layer = static_cast<int>(l);
        double sum = 0, top = 0;
        for (int r = 0; r < ep; ++r) {
            double rows = 0;
            for (size_t e = 0; e < local; ++e)
                rows += static_cast<double>(c[static_cast<size_t>(r) * local + e]);
            rows /= per;
            layer.rows_per_ep_rank.push_back(rows);
            sum += rows;
            top = std::max(top, rows);
        }
        layer.imbalance = sum > 0 ? top / (sum / ep) : 1.0;
        out.push_back(std::move(layer));
    }
    return out;
}

nlohmann::json expert_load_json(const std::vector<LayerExpertLoad>& layers) {
    if (layers.empty())
        return nullptr;
    nlohmann::json list = nlohmann::json::array();
    double sum = 0;
    for (const LayerExpertLoad& l : layers) {
        list.push_back({{"layer", l.layer},
                        {"rows_per_ep_rank", l.rows_per_ep_rank},
                        {"imbalance", l.imbalance}});
        sum += l.imbalance;
    }
    return {{"layers", list}, {"mean_imbalance", sum / static_cast<double>(layers.size())}};
}

double ExpertLoadImbalance::of(int moe_layer_index) const {
    if (per_moe_layer.empty())
        return all;
    return per_moe_layer.at(static_cast<size_t>(moe_layer_index));
}

namespace {

[[noreturn]] void refuse(const std::string& value, const std::string& why) {
    throw Error(ErrorKind::kUsage,
                fmt::format("--expert_load_imbalance {}: {}; give a number >= 1 (the most rows "
                            "an EP rank's experts receive over the mean, 1 for balanced routing, "
                            "e.g. 1.1) or an epo bench run directory, whose metrics.json records "
                            "the measured expert_load",
                            value, why));
}

}  // namespace

ExpertLoadImbalance parse_expert_load_imbalance(const std::string& value) {
    ExpertLoadImbalance out;
    double number = 0;
    const char* end = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(value.data(), end, number);
    if (!value.empty() && ec == std::errc() && ptr == end) {
        if (!std::isfinite(number) || number < 1)
            refuse(value, "an imbalance is at least 1 (the busiest rank over the mean)");
        out.all = number;
        out.source = fmt::format("{:g} for every MoE layer (--expert_load_imbalance)", number);
        return out;
    }
    std::filesystem::path path = value;
    std::error_code fs_error;
    if (std::filesystem::is_directory(path, fs_error))
        path /= "metrics.json";
    try {
        io::require_regular_file(path, "--expert_load_imbalance");
    } catch (const Error& e) {
        refuse(value, fmt::format("neither a number nor a readable file: {}", e.what()));
    }
    std::ifstream in(path);
    if (!in)
        refuse(value, fmt::format("neither a number nor a readable file ({})", path.string()));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        refuse(value, fmt::format("{} is not JSON ({})", path.string(), e.what()));
    }
    const auto it = j.find("expert_load");
    if (it == j.end() || !it->is_object() || !it->contains("layers"))
        refuse(value, fmt::format("{} has no expert_load section (written by epo bench since "
                                  "it measures expert load; rerun the bench)",
                                  path.string()));
    try {
        for (const nlohmann::json& layer : it->at("layers")) {
            const double f = layer.at("imbalance").get<double>();
            if (!std::isfinite(f) || f < 1)
                refuse(value, fmt::format("{}: layer {} has imbalance {}, below 1", path.string(),
                                          layer.value("layer", -1), f));
            out.per_moe_layer.push_back(f);
        }
    } catch (const nlohmann::json::exception& e) {
        refuse(value, fmt::format("{}: malformed expert_load ({})", path.string(), e.what()));
    }
    if (out.per_moe_layer.empty())
        refuse(value, fmt::format("{}: expert_load lists no MoE layer", path.string()));
    std::string list;
    for (double f : out.per_moe_layer)
        list += fmt::format("{}{:.3f}", list.empty() ? "" : ", ", f);
    out.source = fmt::format("{} per MoE layer, measured by epo bench ({})", list, path.string());
    return out;
}

}  // namespace epo::plan
