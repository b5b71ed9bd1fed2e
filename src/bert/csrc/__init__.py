"""C++ kernels shipped as source (this folder) and compiled for this CPU the first time a process needs one, by
the C++ compiler the machine has (`$CXX`, else `c++`), into `$XDG_CACHE_HOME/bert/kernels` (else
`~/.cache/bert/kernels`), where later processes find them. The CPU's vector width is torch's own reading of it
(`torch.backends.cpu.get_cpu_capability()`, which `ATEN_CPU_CAPABILITY` caps): AVX-512 or AVX2. Where there is
no compiler, no such CPU, the build fails, or `BERT_COMPILED_KERNELS=0` is set, `attention_kernel()` is None and
the model keeps torch's kernels; why is logged once (another value of the variable is an InputError). On an AVX-512
CPU with AVX512-BF16 (`torch.cpu`'s reading) the build also holds attention's bfloat16-pairs products. The same
library holds training's attention with dropout and the hidden layers' dropout (`Attention.training`, `.dropout`),
and int8 Linear's input quantization (`.quantize`).

Plain C ABI through ctypes (which lets go of the GIL during a call): no Python or torch headers, so a kernel
builds in about a second.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from bert.errors import InputError

logger = logging.getLogger(__name__)

SWITCH = "BERT_COMPILED_KERNELS"  # "0": torch's kernels only; "1" (the default): the compiled ones where they build
SOURCES = Path(__file__).parent
# torch's name for the CPU's vector extensions -> the compiler's flags for them.
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
# Added where the CPU has AVX512-BF16: attention.cpp's products in bfloat16 pairs (VDPBF16PS).
BF16_FLAGS = ["-mavx512bf16"]
HEAD_SIZES = (32, 64)  # those attention.cpp is built for: BERT's (64) and the MiniLM family's (32)

_P, _INT = ctypes.c_void_p, ctypes.c_int
# bert_attention(q, k, v, bias, out, Tq, T, N, D, scale, first, last, products) -> 0; 1: a head size or bfloat16
# pairs not built; 2: no memory. products: 0 float32, 1 bfloat16 pairs, 2 the same with bfloat16 q, k, v and out.
ATTENTION_ARGS: list[type[ctypes._SimpleCData]] = [*[_P] * 5, *[_INT] * 4, ctypes.c_float, *[_INT] * 3]
# bert_attention_training(q, k, v, bias, lengths, out, dout, lse, dq, dk, dv, Tq, T, N, D, scale, p, seed, first,
# last) -> 0; 1: a head size not built; 2: no memory. dout null: the forward pass (out, lse written), else the
# backward pass; lengths null, or each sequence's count of real tokens (padding after them) to skip the padding.
TRAINING_ARGS: list[type[ctypes._SimpleCData]] = [
    *[_P] * 11,
    *[_INT] * 4,
    ctypes.c_float,
    ctypes.c_float,
    ctypes.c_uint32,
    *[_INT] * 2,
]
# bert_dropout(x, out, width, p, seed, first_row, last_row) -> 0
DROPOUT_ARGS: list[type[ctypes._SimpleCData]] = [_P, _P, _INT, ctypes.c_float, ctypes.c_uint32, *[ctypes.c_int64] * 2]
# bert_quantize(x, q, rows, width, mul, scale, zero) -> 0: [rows, width] floats, each column times mul's (null: 1), to
# bytes, the scale and zero point written to the last two.
QUANTIZE_ARGS: list[type[ctypes._SimpleCData]] = [_P, _P, ctypes.c_int64, ctypes.c_int64, _P, _P, _P]


class Attention(NamedTuple):
    """attention.cpp's `bert_attention` as built here (None where it cannot be), what it is or why not (`bert env`
    prints it), whether it can multiply in bfloat16 pairs, and the library's training kernels built with it:
    `bert_attention_training` and `bert_dropout`."""

    kernel: Callable[..., int] | None
    description: str
    bf16_pairs: bool = False
    training: Callable[..., int] | None = None
    dropout: Callable[..., int] | None = None
    quantize: Callable[..., int] | None = None


class Unavailable(Exception):
    """Why a kernel cannot be had here; `failed` when something went wrong (a warning) rather than being absent."""

    def __init__(self, reason: str, failed: bool = False):
        super().__init__(reason)
        self.failed = failed


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bert" / "kernels"


def build(source: Path, flags: list[str]) -> Path:
    """The shared library of `source` built with `flags`, from the cache or compiled into it (written under a
    temporary name and renamed, so processes building at once never load a half-written file); Unavailable when
    it cannot be."""
    given = shlex.split(os.environ.get("CXX") or "c++")  # $CXX may carry a launcher or flags: "ccache g++"
    compiler = shutil.which(given[0]) if given else None
    if compiler is None:
        raise Unavailable("no C++ compiler (c++ or $CXX) on PATH")
    command = [compiler, *given[1:], "-O3", "-std=c++17", "-shared", "-fPIC", *flags]
    key = hashlib.sha256(source.read_bytes() + "\0".join(command).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{source.stem}-", suffix=".so")
        os.close(fd)
    except OSError as error:
        raise Unavailable(f"cannot write the kernel cache {target.parent} ({error})", failed=True) from None
    try:
        logger.info("compiling %s for this CPU (%s), once: %s", source.name, " ".join(flags), target)
        done = subprocess.run([*command, str(source), "-o", partial], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise Unavailable(f"{source.name} did not compile ({reason})", failed=True)
        os.replace(partial, target)
        return target
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Unavailable(f"{source.name} did not compile ({error})", failed=True) from None
    finally:
        Path(partial).unlink(missing_ok=True)


@functools.cache
def load_attention() -> Attention:
    """attention.cpp's `bert_attention` for this CPU, or None and why it cannot be had here (the module
    docstring), logged once."""
    switch = os.environ.get(SWITCH, "1")
    if switch not in ("0", "1"):
        raise InputError(
            f"{SWITCH}={switch!r}: set it to 0 (torch's attention) or 1 (the compiled kernel, the default)"
        )
    try:
        if switch == "0":
            raise Unavailable(f"{SWITCH}=0")
        capability = torch.backends.cpu.get_cpu_capability()
        flags = ISA_FLAGS.get(capability)
        if flags is None or platform.machine().lower() not in ("x86_64", "amd64"):
            raise Unavailable(f"built for AVX2 or AVX-512 x86 CPUs, and torch reads this one as {capability}")
        pairs = capability == "AVX512" and bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
        library = build(SOURCES / "attention.cpp", flags + BF16_FLAGS if pairs else flags)
    except Unavailable as why:
        logger.log(logging.WARNING if why.failed else logging.INFO, "%s: torch's CPU attention is used", why)
        return Attention(None, f"torch's ({why})")
    loaded = ctypes.CDLL(str(library))
    kernel, training, dropout = loaded.bert_attention, loaded.bert_attention_training, loaded.bert_dropout
    quantize = loaded.bert_quantize
    kernel.argtypes, kernel.restype = ATTENTION_ARGS, _INT
    training.argtypes, training.restype = TRAINING_ARGS, _INT
    dropout.argtypes, dropout.restype = DROPOUT_ARGS, _INT
    quantize.argtypes, quantize.restype = QUANTIZE_ARGS, _INT
    isa = f"{capability} with AVX512-BF16" if pairs else capability
    return Attention(kernel, f"bert.csrc's, built for {isa} ({library})", pairs, training, dropout, quantize)


def attention_kernel() -> Callable[..., int] | None:
    """attention.cpp's `bert_attention` for this CPU, or None where it cannot be had (`load_attention`)."""
    return load_attention().kernel
