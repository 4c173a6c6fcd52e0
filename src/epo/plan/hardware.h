// The hardware a plan is for (docs/plan.md "Hardware figures"): the device's peak dense bf16
// throughput, memory bandwidth and capacity, and the network each GPU sees: its bandwidth inside
// the node (NVLink) and between nodes (its NIC), and a per-collective latency. Every default
// figure is a vendor datasheet number, named with its source; `cpu` (this machine) has no
// datasheet and takes its figures from `epo plan --calibrate kernels`.
//
// Units are the ones the figures are sold in: TFLOP/s (10^12), TB/s (10^12 bytes), GB
// (10^9 bytes), Gbit/s (10^9 bits: a 400 Gbit/s NIC moves 50 GB/s), microseconds. Bandwidths
// are per GPU and per direction, as the link model (comm/link_model.h) takes them.
//
// Deliberately not modelled: NVLink switch or InfiniBand topology beyond "same node / other
// node" (a rail-optimized fat tree gives every GPU its NIC's rate), power or clock throttling.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace epo::plan {

struct DeviceSpec {
    std::string id;               // "h100", as env.gpu names it
    double peak_bf16_tflops = 0;  // dense (no 2:4 sparsity)
    double memory_tbps = 0;       // HBM bandwidth
    double memory_gb = 0;         // HBM capacity
    // Share of the causal score matrix the attention kernels compute: flash attention skips the
    // masked half on a GPU (0.5); the CPU runtime computes whole S x S products (1).
    double attention_fraction = 0.5;
    // Fused (flash) attention keeps the scores on chip: no score or probability bytes in memory,
    // and none held for the backward. The CPU runtime materializes them.
    bool fused_attention = true;
    int num_sms = 0;             // streaming multiprocessors (0: not a GPU)
    std::string source;          // where the figures come from
    double peak_fp8_tflops = 0;  // dense fp8 (0: no fp8 tensor cores; fp8 runs at the bf16 rate)
};

struct NetworkSpec {
    double intra_node_gbps = 0;  // per GPU, each direction (NVLink)
    double inter_node_gbps = 0;  // per GPU NIC, each direction
    double latency_us = 0;       // added once per collective
    std::string source;
};

struct Hardware {
    DeviceSpec device;
    NetworkSpec network;
};

// The planner's device table: h100, h200, b200, gb200 and cpu.
const std::vector<DeviceSpec>& plan_devices();
std::string plan_device_list();  // "h100, h200, b200, gb200, cpu"

// The device env.gpu names (an id, or a full name such as "NVIDIA H100 80GB HBM3", resolved by
// config::find_device); nullopt when the planner has no figures for it.
std::optional<DeviceSpec> find_plan_device(std::string_view env_gpu);

// The network a device family ships with (DGX/HGX reference systems): NVLink per GPU inside
// the node, one NIC per GPU between nodes.
NetworkSpec default_network(const DeviceSpec& device);

// What the user may change on the command line; empty = the default.
struct HardwareOverrides {
    std::optional<double> peak_bf16_tflops, memory_tbps, memory_gb;
    std::optional<double> intra_node_gbps, inter_node_gbps, latency_us;
};

// The device of `env_gpu` with its default network and the overrides applied, validated.
// Raises kConfig naming the field (env.gpu or the flag), its value and the fix.
Hardware resolve_hardware(std::string_view env_gpu, const HardwareOverrides& overrides);

// Every figure positive and finite (latency: zero allowed) and within what a device or link
// can be; kConfig naming the flag, its value and the fix.
void validate_hardware(const Hardware& hardware);

}  // namespace epo::plan
