"""bench/isa.py's `--isa avx2`: the bench starts again with torch's, oneDNN's, MKL's and fbgemm's caps set, so
kernels chosen after torch has started are capped too, and the CPU line says so."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("isa", REPO / "bench" / "isa.py")
assert spec is not None and spec.loader is not None
isa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(isa)

SCRIPT = """
import json, os, sys
sys.path.insert(0, {bench!r})
import torch
torch.ones(8).add(1)  # torch's kernels dispatched once before the cap is asked for
import isa
from bert.cpu_kernels import bf16_in_hardware
isa.apply(sys.argv[1])
print(json.dumps({{"capability": torch.backends.cpu.get_cpu_capability(), "bf16": bf16_in_hardware(),
                  "cpu": isa.cpu_name(), "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA")}}))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the caps are x86 instruction sets")
def test_isa_avx2_restarts_the_bench_with_every_library_capped(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT.format(bench=str(REPO / "bench")), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in isa.CAPS["avx2"]}

    def probe(cap: str) -> dict:
        out = subprocess.run([sys.executable, str(script), cap], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    native = probe("native")
    if native["capability"] not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU runs torch's {native['capability']} kernels, nothing to cap to AVX2")
    assert native["onednn"] is None and "capped" not in native["cpu"]
    capped = probe("avx2")
    assert capped["capability"] == "AVX2"
    assert capped["bf16"] is False  # our bfloat16 kernel choice follows oneDNN's cap
    assert capped["onednn"] == "AVX2"
    assert "capped: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" in capped["cpu"]
