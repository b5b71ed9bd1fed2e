"""The CPU a bench ran on, and `--isa avx2`: a bench run on an AVX-512 CPU as on one with AVX2 and FMA only.
Standard library only: bench/peer_engines.py imports it under the peers' Pythons.

Some of the machines users (and this project) run on are AMD EPYCs without AVX-512, VNNI or bfloat16; where none
is at hand, each library's own switch caps the instructions its kernels may use. They are read when each library
first runs, so `apply` starts the bench again with them set:
- ATEN_CPU_CAPABILITY=avx2: torch's vectorized operators (softmax, GELU, layer norm, the optimizers' loops);
- ONEDNN_MAX_CPU_ISA=AVX2: oneDNN, i.e. torch's Linear and matmul kernels as this project calls them, and the
  oneDNN inside OpenVINO (its attention subgraphs, its oneDNN FullyConnected layers, its int8 layers);
- MKL_ENABLE_INSTRUCTIONS=AVX2: MKL (torch's F.linear and bmm);
- FBGEMM_ENABLE_INSTRUCTIONS=AVX2: fbgemm (torch's int8 Linear).
bert.csrc's attention kernel follows torch's reading of the CPU, so the first cap builds and runs its AVX2 version.
Not capped: MLAS, which picks its kernels from CPUID alone: all of ONNX Runtime's (sentence-transformers' ONNX
backend, fastembed) and OpenVINO's float32 FullyConnected layers run as MLAS GEMMs (30 of all-MiniLM-L6-v2's 36;
bench_peers prints each OpenVINO engine's kernels). Those peers keep AVX-512 GEMMs under the cap, so it favours
them. Nor does a cap make this CPU's cores, caches or clocks those of an AVX2 machine: it says how the code
paths compare, not what an AVX2 machine measures.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
from pathlib import Path

CAPS = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    }
}


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--isa",
        choices=("native", *CAPS),
        default="native",
        help="native: every instruction the CPU has; avx2: torch, oneDNN, MKL and fbgemm capped to AVX2 "
        "(bench/isa.py says what else is and is not capped)",
    )


def apply(isa: str) -> None:
    """Start this bench again with `isa`'s caps in its environment, unless they are there already."""
    if isa == "native":
        return
    wanted = CAPS[isa]
    if all(os.environ.get(name) == value for name, value in wanted.items()):
        return
    os.environ.update(wanted)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *sys.argv])


def _cpuinfo() -> str:
    return Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags as the kernel lists them (none where /proc/cpuinfo is absent)."""
    listed = re.search(r"flags\s*:\s*(.+)", _cpuinfo())
    return set(listed.group(1).split()) if listed else set()


def cpu_name() -> str:
    """The CPU's model, its family and model numbers (a virtual machine's model name may be the vendor's line
    alone, "AMD EPYC", while family 25 model 17 is a Zen 4 core and family 26 a Zen 5: half and full-width AVX-512
    units), the flags that choose kernels, and the cap in force, if any."""
    info = _cpuinfo()
    model = re.search(r"model name\s*:\s*(.+)", info)
    numbers = re.search(r"cpu family\s*:\s*(\d+)\s*\nmodel\s*:\s*(\d+)", info)
    flags = cpu_flags()
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    name = model.group(1).strip() if model else platform.processor()
    if numbers:
        name += f", family {numbers.group(1)} model {numbers.group(2)}"
    caps = [f"{variable}={os.environ[variable]}" for variable in CAPS["avx2"] if variable in os.environ]
    capped = f"; capped: {' '.join(caps)}" if caps else ""
    return f"{name} (flags: {' '.join(f for f in wanted if f in flags)}{capped})"
