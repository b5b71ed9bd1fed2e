"""`bert env`: what a bug report needs to know about the machine, one `name: value` line each.

The package and Python versions, torch with its threads and build, the devices (CUDA GPUs and whether
they run bf16, the CPU's instruction set), the CPU attention kernel (`bert.csrc`), the int8 path, and every
optional extra the package's own metadata declares (`importlib.metadata`: pyproject.toml's
`[project.optional-dependencies]` as installed), each installed or not, with what it lacks.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bert import __version__

DISTRIBUTION = "bert"  # pyproject.toml's [project] name
# Optional packages outside the extras.
OPTIONAL = {
    "blingfire": "the faster sentence splitter of prepare-corpus",
    "google-crc32c": "faster TFRecord checksums",
    "crc32c": "faster TFRecord checksums",
}


@dataclass
class EnvArgs:
    """Print the versions, threads, devices and optional extras that a bug report should include."""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def extras() -> dict[str, list[str]]:
    """The package's extras -> the requirements each one lists (`bert[x]` for an extra another includes),
    from the installed metadata's Provides-Extra and Requires-Dist."""
    try:
        meta = metadata.metadata(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {name: [] for name in meta.get_all("Provides-Extra") or []}
    for requirement in meta.get_all("Requires-Dist") or []:
        marker = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if marker and marker.group(1) in out:
            name = re.match(r"[A-Za-z0-9_.-]+(\[[^\]]*\])?", requirement.strip())
            if name:
                out[marker.group(1)].append(name.group(0))
    return out


def _extra_status(extra: str, table: dict[str, list[str]]) -> str:
    """ "installed (pkg version, ...)" or "not installed (missing ...); pip install ...", an included extra
    (`bert[minilm]` in `test`) counting as its own packages."""
    found: list[str] = []
    missing: list[str] = []
    for requirement in table[extra]:
        included = re.fullmatch(rf"{DISTRIBUTION}\[(.+)\]", requirement)
        if included:
            inner = _extra_status(included.group(1), table) if included.group(1) in table else "not installed"
            (found if inner.startswith("installed") else missing).append(f"[{included.group(1)}]")
            continue
        version = _version(requirement)
        (found if version else missing).append(f"{requirement} {version}" if version else requirement)
    if not missing:
        return f"installed ({', '.join(found)})"
    return f"not installed (missing {', '.join(missing)}); pip install '{DISTRIBUTION}[{extra}]'"


def _cpu() -> str:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    flags: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    capability = torch.backends.cpu.get_cpu_capability()
    bf16 = {"avx512_bf16", "amx_bf16"} & flags
    fast_bf16 = f"; bf16 instructions: {', '.join(sorted(bf16))}" if bf16 else ""
    return f"{name} ({os.cpu_count()} logical cores; torch kernels {capability}{fast_bf16})"


def _attention() -> str:
    """Which kernel runs inference attention on the CPU: bert.csrc's, built here (on first use), or torch's and why."""
    from bert import csrc  # imports torch: see _cpu

    return csrc.load_attention().description


def _int8() -> str:
    """Which Linear layers `--quantize=int8` runs on the CPU (`bert.quantization`)."""
    from bert.cpu_kernels import onednn_int8  # imports torch: see _cpu

    if onednn_int8():
        return "oneDNN's int8 Linear (VNNI; 8-bit weights, LayerNorm-fed inputs smoothed)"
    return "torch's dynamically quantized Linear (fbgemm; 7-bit weights: no VNNI here, or ONEDNN_MAX_CPU_ISA below it)"


def environment() -> dict[str, Any]:
    """The report as an ordered dict of strings."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    info: dict[str, Any] = {
        "bert": f"{__version__} ({Path(__file__).resolve().parents[1]})",
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})",
        "threads": f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
        "cpu": _cpu(),
        "attention": _attention(),
        "int8": _int8(),
    }
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        bf16 = "yes" if torch.cuda.is_bf16_supported() else "no"
        info["cuda"] = f"{len(names)} device(s): {', '.join(names)}; bf16: {bf16}"
    else:
        info["cuda"] = "not available (training runs on the CPU)"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info["mps"] = "available (--device=mps)"
    for package in ("numpy", "tokenizers", "safetensors", "tqdm"):
        info[package] = _version(package) or "missing"
    table = extras()
    if not table:
        info["extras"] = f"unknown: no installed metadata for {DISTRIBUTION} (pip install -e .)"
    for extra in table:
        info[f"extra [{extra}]"] = _extra_status(extra, table)
    for package, why in OPTIONAL.items():
        if _version(package):
            info[package] = f"{_version(package)} ({why})"
    return info


def run_env(args: EnvArgs) -> dict[str, Any]:
    """Print the report, one `name: value` line each; returns it."""
    info = environment()
    width = max(len(k) for k in info) + 1
    for key, value in info.items():
        print(f"{key + ':':<{width}} {value}")
    return info
