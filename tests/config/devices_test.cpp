#include "epo/config/devices.h"

#include <gtest/gtest.h>

#include <map>

#include "config_test_util.h"

namespace epo::config {
namespace {

using testing::expect_error;
using testing::ids;

// A probe that returns `device` and counts its calls.
struct CountingProbe {
    DeviceInfo device;
    int calls = 0;
    DeviceProbe probe() {
        return [this] {
            ++calls;
            return device;
        };
    }
};

ModelConfig moe_model() {
    ModelConfig m = make_recipe("tiny-moe").model;
    m.moe_shared_expert_overlap = true;
    return m;
}

TEST(Devices, TableHasEveryIdWithItsCapability) {
    const std::map<std::string, std::pair<int, int>> expected = {
        {"p100", {6, 0}},   {"v100", {7, 0}},  {"t4", {7, 5}},     {"a100", {8, 0}},
        {"a10", {8, 6}},    {"a40", {8, 6}},   {"l40s", {8, 9}},   {"h100", {9, 0}},
        {"h800", {9, 0}},   {"h200", {9, 0}},  {"h20", {9, 0}},    {"b200", {10, 0}},
        {"gb200", {10, 0}}, {"b300", {10, 3}}, {"gb300", {10, 3}}, {"rtx5090", {12, 0}},
        {"cpu", {0, 0}}};
    ASSERT_EQ(known_devices().size(), expected.size());
    for (const auto& d : known_devices()) {
        ASSERT_TRUE(expected.count(d.id)) << d.id;
        EXPECT_EQ(std::make_pair(d.major, d.minor), expected.at(d.id)) << d.id;
        EXPECT_EQ(find_device(d.id)->id, d.id);
        EXPECT_EQ(d.is_cpu, d.id == "cpu");
    }
    EXPECT_EQ(find_device("B200")->name, "NVIDIA B200");
    EXPECT_EQ(find_device("gb200")->name, "NVIDIA GB200");
}

TEST(Devices, FullNamesMatchByFamilyPrefix) {
    EXPECT_EQ(find_device("NVIDIA H100 80GB HBM3")->id, "h100");
    EXPECT_EQ(find_device("NVIDIA H100 PCIe")->id, "h100");
    EXPECT_EQ(find_device("NVIDIA A100-SXM4-80GB")->id, "a100");
    EXPECT_EQ(find_device("NVIDIA A10")->id, "a10");
    EXPECT_EQ(find_device("NVIDIA H20")->id, "h20");
    EXPECT_EQ(find_device("NVIDIA H200")->id, "h200");
    EXPECT_EQ(find_device("Tesla V100-SXM2-32GB")->id, "v100");
    EXPECT_EQ(find_device("NVIDIA V100")->id, "v100");
    EXPECT_EQ(find_device("Tesla P100-PCIE-16GB")->id, "p100");
    EXPECT_EQ(find_device("NVIDIA GeForce RTX 5090")->id, "rtx5090");
    EXPECT_EQ(find_device("nvidia b200 sxm")->name, "NVIDIA B200 sxm");
    EXPECT_FALSE(find_device("NVIDIA A1000").has_value());
    EXPECT_FALSE(find_device("NVIDIA Future GPU").has_value());
    EXPECT_FALSE(find_device("tpu").has_value());
    expect_error([] { table_probe("tpu")(); }, ErrorKind::kConfig,
                 {"env.gpu = 'tpu'", "known devices", "h100", "gb300", "cpu"});
}

TEST(Devices, FlexGatingForEveryDevice) {
    const std::map<std::string, std::pair<bool, bool>> supported = {
        // deepep, hybridep
        {"p100", {false, false}},    {"v100", {false, false}}, {"t4", {false, false}},
        {"a100", {true, true}},      {"a10", {true, true}},    {"a40", {true, true}},
        {"l40s", {true, true}},      {"h100", {true, true}},   {"h800", {true, true}},
        {"h200", {true, true}},      {"h20", {true, true}},    {"b200", {true, true}},
        {"gb200", {false, true}},    {"b300", {true, true}},   {"gb300", {false, true}},
        {"rtx5090", {false, false}}, {"cpu", {true, true}}};
    for (const auto& d : known_devices()) {
        SCOPED_TRACE(d.id);
        EXPECT_EQ(flex_backend_supported(FlexBackend::kDeepep, d), supported.at(d.id).first);
        EXPECT_EQ(flex_backend_supported(FlexBackend::kHybridep, d), supported.at(d.id).second);
        for (const char* backend : {"deepep", "hybridep"}) {
            const bool ok = std::string(backend) == "deepep" ? supported.at(d.id).first
                                                             : supported.at(d.id).second;
            ModelConfig m = moe_model();
            CountingProbe probe{d};
            const auto result = apply_flex_dispatcher_backend(m, backend, probe.probe());
            EXPECT_EQ(probe.calls, 1);
            EXPECT_EQ(result.activated, ok) << backend;
            EXPECT_EQ(m.moe_token_dispatcher_type,
                      ok ? DispatcherType::kFlex : DispatcherType::kAlltoall);
            EXPECT_EQ(m.moe_shared_expert_overlap, !ok);  // unchanged on fallback
            EXPECT_EQ(ids(result.warnings),
                      ok ? std::vector<std::string>{} : std::vector<std::string>{"W007"});
            // Validation of the built config agrees with the activation.
            m.moe_token_dispatcher_type = DispatcherType::kFlex;
            m.moe_flex_dispatcher_backend = parse_enum<FlexBackend>(backend);
            const auto finding = check_flex_backend(m, probe.probe());
            EXPECT_EQ(finding.has_value(), !ok);
            if (finding) {
                EXPECT_EQ(finding->id, std::string(backend) == "deepep" ? "FX001" : "FX002");
            }
        }
    }
}

TEST(FlexActivation, DeepepOnAmpereAndHopperOverridesEarlierValues) {
    for (int major : {8, 9}) {
        ModelConfig m = moe_model();
        m.moe_token_dispatcher_type = DispatcherType::kAllgather;
        CountingProbe probe{{"x", "NVIDIA X", major, 0}};
        const auto result = apply_flex_dispatcher_backend(m, "deepep", probe.probe());
        EXPECT_TRUE(result.activated);
        EXPECT_TRUE(result.warnings.empty());
        EXPECT_EQ(m.moe_token_dispatcher_type, DispatcherType::kFlex);
        EXPECT_EQ(m.moe_flex_dispatcher_backend, FlexBackend::kDeepep);
        EXPECT_FALSE(m.moe_shared_expert_overlap);
        EXPECT_EQ(probe.calls, 1);
    }
}

TEST(FlexActivation, ProbeFailurePropagates) {
    ModelConfig m = moe_model();
    int calls = 0;
    const DeviceProbe failing = [&]() -> DeviceInfo {
        ++calls;
        throw Error(ErrorKind::kConfig, "CUDA initialization failed");
    };
    expect_error([&] { apply_flex_dispatcher_backend(m, "deepep", failing); }, ErrorKind::kConfig,
                 {"CUDA initialization failed"});
    EXPECT_EQ(calls, 1);
    expect_error([&] { apply_flex_dispatcher_backend(m, "deepep", table_probe("bogus")); },
                 ErrorKind::kConfig, {"names no known device"});
}

TEST(FlexActivation, NonMoeModelWarnsChangesNothingAndDoesNotProbe) {
    for (std::optional<int> experts : {std::optional<int>(), std::optional<int>(0)}) {
        ModelConfig m = moe_model();
        m.num_moe_experts = experts;
        const ModelConfig before = m;
        CountingProbe probe{{"h100", "NVIDIA H100", 9, 0}};
        const auto result = apply_flex_dispatcher_backend(m, "deepep", probe.probe());
        EXPECT_EQ(ids(result.warnings), std::vector<std::string>{"W006"});
        EXPECT_EQ(m, before);
        EXPECT_EQ(probe.calls, 0);
    }
}

TEST(FlexActivation, VoltaAndPascalWarnAndFallBack) {
    for (const char* id : {"v100", "p100"}) {
        ModelConfig m = moe_model();
        m.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
        const auto result = apply_flex_dispatcher_backend(m, "deepep", table_probe(id));
        ASSERT_EQ(ids(result.warnings), std::vector<std::string>{"W007"});
        EXPECT_NE(result.warnings[0].message.find("Tesla"), std::string::npos);
        EXPECT_EQ(m.moe_token_dispatcher_type, DispatcherType::kAlltoall);
        EXPECT_FALSE(m.moe_flex_dispatcher_backend.has_value());
        EXPECT_TRUE(m.moe_shared_expert_overlap);
    }
}

TEST(FlexActivation, UnsupportedBackendsFallBackWithOneProbe) {
    struct Case {
        const char* backend;
        DeviceInfo device;
        const char* warning;
    };
    for (const Case& c : {Case{"deepep", {"gb200", "NVIDIA GB200", 10, 0}, "W007"},
                          Case{"hybridep", {"x200", "NVIDIA X200", 11, 0}, "W007"},
                          Case{"ncclep", {"a100", "NVIDIA A100", 8, 0}, "W008"}}) {
        SCOPED_TRACE(c.backend);
        ModelConfig m = moe_model();
        CountingProbe probe{c.device};
        const auto result = apply_flex_dispatcher_backend(m, c.backend, probe.probe());
        EXPECT_EQ(ids(result.warnings), std::vector<std::string>{c.warning});
        EXPECT_EQ(m.moe_token_dispatcher_type, DispatcherType::kAlltoall);
        EXPECT_FALSE(m.moe_flex_dispatcher_backend.has_value());
        EXPECT_TRUE(m.moe_shared_expert_overlap);  // left as it was
        EXPECT_EQ(probe.calls, 1);                 // probed exactly once, before the name check
    }
}

TEST(FlexValidation, OnlyFlexProbesAndANullBackendIsNoError) {
    ModelConfig m = moe_model();
    m.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
    m.moe_token_dispatcher_type = DispatcherType::kAlltoall;
    CountingProbe volta{{"v100", "Tesla V100", 7, 0}};
    EXPECT_FALSE(check_flex_backend(m, volta.probe()).has_value());
    EXPECT_EQ(volta.calls, 0);  // not flex: never probed
    m.moe_token_dispatcher_type = DispatcherType::kFlex;
    m.moe_flex_dispatcher_backend.reset();
    EXPECT_FALSE(check_flex_backend(m, volta.probe()).has_value());
    m.moe_flex_dispatcher_backend = FlexBackend::kDeepep;
    const auto volta_error = check_flex_backend(m, volta.probe());
    ASSERT_TRUE(volta_error.has_value());
    EXPECT_EQ(volta_error->id, "FX001");
    EXPECT_NE(volta_error->message.find("Tesla V100"), std::string::npos);
    EXPECT_NE(volta_error->message.find("Hopper"), std::string::npos);
    CountingProbe future{{"future", "NVIDIA Future GPU", 200, 0}};
    EXPECT_EQ(check_flex_backend(m, future.probe())->id, "FX001");
}

TEST(FlexValidation, HybridepAppliesAndValidatesOnGb200ButNotOnMajor11) {
    ModelConfig m = moe_model();
    EXPECT_TRUE(apply_flex_dispatcher_backend(m, "hybridep", table_probe("gb200")).activated);
    EXPECT_FALSE(check_flex_backend(m, table_probe("gb200")).has_value());
    CountingProbe major11{{"x", "NVIDIA X300", 11, 0}};
    const auto finding = check_flex_backend(m, major11.probe());
    ASSERT_TRUE(finding.has_value());
    EXPECT_EQ(finding->id, "FX002");
}

}  // namespace
}  // namespace epo::config
