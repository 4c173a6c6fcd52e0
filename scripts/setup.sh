#!/usr/bin/env bash
# Installs every dependency EPO builds and runs with, from Debian packages. Idempotent: when all
# packages are present it only checks (well under a second) and installs nothing.
# `scripts/setup.sh mpich` also installs MPICH next to Open MPI, for the `mpich` CMake preset
# (Open MPI keeps the higher Debian alternatives priority, so `mpirun`/`mpicc` stay Open MPI).
# `scripts/setup.sh peers` also installs PyTorch (python3-torch), the peer that
# scripts/bench_moe_vs_pytorch.sh times the MoE layer against (not needed to build or test).
set -euo pipefail

packages=(
  g++ cmake ninja-build pkgconf
  libopenmpi-dev openmpi-bin          # MPI: the distributed engine (MPICH works too)
  libdnnl-dev ocl-icd-opencl-dev      # oneDNN: bf16/fp32 GEMM (its CMake config requires OpenCL)
  libyaml-cpp-dev nlohmann-json3-dev  # configs in, reports and metadata out
  libcli11-dev libfmt-dev             # the command line; message formatting
  libssl-dev                          # SHA-256 checksums of checkpoint files
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format                        # the formatting check (ctest clang_format)
  python3                             # scripts/sweep_overlap.py (standard library only) and its test
  python3-dev pybind11-dev python3-pybind11  # the Python module `epo` (python/)
  python3-pytest python3-yaml         # its tests (python/tests, run by ctest as python_module)
  iproute2                            # scripts/emulated-cluster.sh: hosts as network namespaces
  nftables                            # scripts/emulated-cluster.sh impair: packet loss
  chromium                            # the report's browser test (ctest bench.report_browser)
)
if [[ "${1:-}" == mpich ]]; then
  packages+=(libmpich-dev mpich)
fi
if [[ "${1:-}" == peers ]]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
