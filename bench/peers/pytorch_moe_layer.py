#!/usr/bin/python3
"""The peer of bench/moe_bench.cpp's BM_MoeLayer: the same MoE layer in PyTorch (Debian's
python3-torch 1.13, CPU), so both can be timed alternately under the same machine load
(scripts/bench_moe_vs_pytorch.sh).

Layer: hidden H = 2048, expert FFN F = 768 (SwiGLU, gate rows first), E = 8 experts, top-2
softmax router (softmax over the chosen top-k logits, as moe_router_pre_softmax=false), aux
load-balancing loss 1e-3, dropless; permute with a stable sort by expert, one nn.Linear pair per
expert over its contiguous rows, routing weight applied before the second projection, combine by
index_add. bf16 activations and weights, one thread. Forward, then the backward fed the output
gradient dy directly and 1 for the aux loss (torch.autograd.backward([y, aux], [dy, 1])), as
EPO's side is fed dy: no extra loss computed on either side. Timed per step; FLOPs counted as the
C++ benchmark counts them: 3 * T * K * 6 * H * F (router not counted).

Usage: pytorch_moe_layer.py TOKENS [STEPS] [WARMUP]
Prints one line per timed step: `step <i> wall_ms <ms> cpu_ms <ms> faults <minor faults>`,
then `median wall_ms <ms> cpu_ms <ms> GFLOP/s(cpu) <x> GFLOP/s(wall) <y>`.
Run with MALLOC_MMAP_MAX_=0 and a high MALLOC_TRIM_THRESHOLD_ (the wrapper does): glibc then
keeps and reuses freed memory, as the PyTorch figures in docs/numerics.md were measured; with the
default, PyTorch's large temporaries are mapped and unmapped every step (thousands of page faults
per step at 4096 tokens).
"""
import resource
import sys
import time

import torch
import torch.nn.functional as F

H, FFN, E, K = 2048, 768, 8, 2
AUX_COEFF = 1e-3


class MoeLayer(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.router = torch.nn.Linear(H, E, bias=False, dtype=dtype)
        self.fc1 = torch.nn.ModuleList(
            [torch.nn.Linear(H, 2 * FFN, bias=False, dtype=dtype) for _ in range(E)])
        self.fc2 = torch.nn.ModuleList(
            [torch.nn.Linear(FFN, H, bias=False, dtype=dtype) for _ in range(E)])
        for p in self.parameters():
            torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, x):
        t = x.shape[0]
        logits = self.router(x).float()                       # (T, E)
        top_logits, top_idx = logits.topk(K, dim=-1)           # (T, K)
        weights = torch.softmax(top_logits, dim=-1)            # (T, K)
        # aux loss: coeff * E / (K * T^2) * sum_e (sum_t s[t,e]) * c[e]
        scores = torch.softmax(logits, dim=-1)
        counts = torch.bincount(top_idx.flatten(), minlength=E)
        aux = AUX_COEFF * E / (K * t * t) * (scores.sum(0) * counts.float()).sum()

        flat_expert = top_idx.flatten()                        # (T*K)
        order = torch.sort(flat_expert, stable=True).indices   # expert-major, token order inside
        token_of_row = order // K
        x_perm = x.index_select(0, token_of_row)               # (T*K, H)
        w_perm = weights.flatten().index_select(0, order).to(x.dtype)
        splits = counts.tolist()
        outs = []
        for e, (xe, we) in enumerate(zip(x_perm.split(splits), w_perm.split(splits))):
            gate, up = self.fc1[e](xe).chunk(2, dim=-1)        # (R_e, F) each
            outs.append(self.fc2[e](F.silu(gate) * up * we.unsqueeze(-1)))
        y_perm = torch.cat(outs)                               # (T*K, H)
        y = torch.zeros_like(x).index_add(0, token_of_row, y_perm)
        return y, aux


def main():
    tokens = int(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    layer = MoeLayer(dtype)
    x = torch.randn(tokens, H, dtype=dtype, requires_grad=True)
    dy = torch.randn(tokens, H, dtype=dtype)

    one = torch.ones((), dtype=torch.float32)

    def step():
        y, aux = layer(x)
        # Gradients accumulate into .grad (bf16, a separate add), as gradient accumulation does.
        torch.autograd.backward([y, aux], [dy, one])

    for _ in range(warmup):
        step()
    walls, cpus = [], []
    for i in range(steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        walls.append(wall)
        cpus.append(cpu)
        print(f"step {i} wall_ms {wall * 1e3:.1f} cpu_ms {cpu * 1e3:.1f} faults {faults}")
    flops = 3.0 * tokens * K * 6 * H * FFN
    mw, mc = sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2]
    print(f"median wall_ms {mw * 1e3:.1f} cpu_ms {mc * 1e3:.1f} "
          f"GFLOP/s(cpu) {flops / mc * 1e-9:.1f} GFLOP/s(wall) {flops / mw * 1e-9:.1f}")


if __name__ == "__main__":
    main()
