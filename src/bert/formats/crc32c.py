"""CRC-32C (Castagnoli), the checksum of TensorFlow's on-disk formats, without a compiled dependency.

TFRecord framing, the blocks of a checkpoint's `.index` table and every tensor of a checkpoint's
`.data-*` shards carry a *masked* CRC-32C (`masked_crc32c`). This module computes it three ways:

- an accelerated package, if one happens to be importable (`google_crc32c` or `crc32c`; neither is a
  dependency, and each is checked against a known vector before it is trusted);
- pure Python with slicing-by-8 tables (`crc32c_pure`), the readable reference, used for short inputs;
- NumPy "lanes" for long inputs and for batches. CRC is linear over GF(2): the register after a message
  is the XOR of per-position table lookups of its bytes, except that the position tables would be as many
  as the bytes. So a long buffer is cut into K lanes that advance together, 32 bytes per step: the table
  lookups of every 32-byte group are done in bulk, vectorised over the whole buffer, and only the
  "append 32 zero bytes" step runs in a Python loop. The K partial results are combined with the zlib
  `crc32_combine` trick (appending n zero bytes is a 32x32 bit matrix). A batch of short messages
  (`crc32c_many`, used for TFRecord files) runs one message per lane; every lane starts from the
  all-zero register, which leading zero padding does not move, so messages of any length share a batch.

All three give identical results; the tests check the fast paths against `crc32c_pure`.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["crc32c", "crc32c_many", "crc32c_pure", "masked_crc32c", "masked_crc32c_many", "mask", "unmask"]

_POLY = 0x82F63B78  # Castagnoli polynomial 0x1EDC6F41, bit-reflected
_MASK_DELTA = 0xA282EAD8  # TensorFlow's crc32c::Mask constant (tensorflow/core/lib/hash/crc32c.h)
_U32 = 0xFFFFFFFF
_CACHE_LOCK = threading.RLock()  # the lazily grown tables below are shared by threads


def _make_tables() -> list[list[int]]:
    t0 = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(c >> 8) ^ t0[c & 0xFF] for c in prev])
    return tables  # tables[k][b]: register effect of byte b followed by k zero bytes


_T = _make_tables()
_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _T
_NP_T = [np.array(t, dtype=np.uint32) for t in _T[:4]]


def _update_pure(state: int, data) -> int:
    """Advance the raw (uninverted) register `state` over `data` with slicing-by-8."""
    mv = memoryview(data).cast("B")
    n8 = len(mv) - len(mv) % 8
    t0, t1, t2, t3, t4, t5, t6, t7 = _T
    for a, b in struct.iter_unpack("<II", mv[:n8]):
        a ^= state
        state = (
            t7[a & 0xFF]
            ^ t6[(a >> 8) & 0xFF]
            ^ t5[(a >> 16) & 0xFF]
            ^ t4[a >> 24]
            ^ t3[b & 0xFF]
            ^ t2[(b >> 8) & 0xFF]
            ^ t1[(b >> 16) & 0xFF]
            ^ t0[b >> 24]
        )
    for byte in mv[n8:]:
        state = t0[(state ^ byte) & 0xFF] ^ (state >> 8)
    return state


def crc32c_pure(data, crc: int = 0) -> int:
    """CRC-32C of `data` in pure Python; `crc` continues an earlier result (crc of a prefix)."""
    return _update_pure(crc ^ _U32, data) ^ _U32


# ----------------------------------------------------------------------------------------------------
# GF(2) operators: "append m zero bytes to the message" as a 32x32 bit matrix, stored as the list of
# its 32 columns (the images of 1 << j). zeros_op(m) is cached for powers of two.


def _apply(op: Sequence[int], v: int) -> int:
    out = 0
    j = 0
    while v:
        if v & 1:
            out ^= op[j]
        v >>= 1
        j += 1
    return out


def _compose(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """The operator a(b(x))."""
    return [_apply(a, col) for col in b]


# _POW2_OPS[i] appends 2**i zero bytes. One zero byte maps x to T0[x & 0xff] ^ (x >> 8).
_POW2_OPS: list[list[int]] = [[_T0[1 << j] if j < 8 else 1 << (j - 8) for j in range(32)]]


def _pow2_op(i: int) -> list[int]:
    if len(_POW2_OPS) <= i:
        with _CACHE_LOCK:
            while len(_POW2_OPS) <= i:
                last = _POW2_OPS[-1]
                _POW2_OPS.append(_compose(last, last))
    return _POW2_OPS[i]


def _zeros_op(m: int) -> list[int]:
    op = [1 << j for j in range(32)]
    i = 0
    while m:
        if m & 1:
            op = _compose(_pow2_op(i), op)
        m >>= 1
        i += 1
    return op


def _shift_zeros(v: int, m: int) -> int:
    """The register after feeding m zero bytes to register v."""
    i = 0
    while m and v:
        if m & 1:
            v = _apply(_pow2_op(i), v)
        m >>= 1
        i += 1
    return v


def _byte_tables(op: Sequence[int]) -> np.ndarray:
    """[4, 256] uint32 tables so that op(x) = t[0][x & 255] ^ t[1][(x >> 8) & 255] ^ ..."""
    cols = np.array(op, dtype=np.uint32).reshape(4, 8)
    b = np.arange(256, dtype=np.uint32)
    t = np.zeros((4, 256), dtype=np.uint32)
    for k in range(8):
        t ^= np.where(((b >> k) & 1).astype(bool)[None, :], cols[:, k : k + 1], np.uint32(0))
    return t


def _apply_tables(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    xb = x.view(np.uint8).reshape(-1, 4)  # little-endian bytes of each register
    return t[0][xb[:, 0]] ^ t[1][xb[:, 1]] ^ t[2][xb[:, 2]] ^ t[3][xb[:, 3]]


# ----------------------------------------------------------------------------------------------------
# NumPy lanes. A register advanced over a G-byte group is  s' = zeros_op(G)(s) ^ register(0, group),  and
# register(0, group) is a XOR of per-position table lookups of the group's 16-bit chunks. So the lookups for
# every group of every lane are done in bulk (vectorised over the whole buffer), and only the cheap
# zeros_op(G) step, two 64K-entry lookups per lane, runs in a Python loop over the groups.

_G = 32  # bytes per group
_LANE_TABLES: list = []


def _lane_tables() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    if not _LANE_TABLES:
        _build_lane_tables()
    return tuple(_LANE_TABLES)


def _build_lane_tables() -> None:
    with _CACHE_LOCK:
        if _LANE_TABLES:
            return
        x = np.arange(1 << 16, dtype=np.uint32)
        chunk = _NP_T[1][x & 0xFF] ^ _NP_T[0][x >> 8]  # register(0, two bytes b0 b1), x = b0 | b1 << 8
        per_pos = []
        for i in range(_G // 2):
            zeros_after = _G - 2 * i - 2
            per_pos.append(_apply_tables(_byte_tables(_zeros_op(zeros_after)), chunk) if zeros_after else chunk)
        step = _byte_tables(_zeros_op(_G))
        _LANE_TABLES.extend([per_pos, _apply_tables(step, x), _apply_tables(step, x << 16)])


def _advance_lanes(lanes: np.ndarray) -> np.ndarray:
    """Registers after running K registers, all starting at 0, over the rows of `lanes` [K, m * G] uint8."""
    k, width = lanes.shape
    steps = width // _G
    per_pos, step_lo, step_hi = _lane_tables()
    chunks = lanes.view("<u2").reshape(k, steps, _G // 2)
    s = np.zeros(k, dtype=np.uint32)
    halves = s.view(np.uint16).reshape(k, 2)
    block = max(1, (1 << 20) // (k * _G))  # groups per bulk pass: ~1 MB of input, so it stays in cache
    for a in range(0, steps, block):
        sub = chunks[:, a : a + block, :]
        groups = per_pos[0][sub[:, :, 0]]  # [K, block] register(0, group)
        for i in range(1, _G // 2):
            groups ^= per_pos[i][sub[:, :, i]]
        groups = groups.T.copy()  # [block, K]
        for g in groups:
            t = step_lo[halves[:, 0]]
            t ^= step_hi[halves[:, 1]]
            np.bitwise_xor(t, g, out=s)
    return s


@functools.lru_cache(maxsize=64)
def _combine_tables(lane_bytes: int, levels: int) -> list[np.ndarray]:
    tables = []
    op = _zeros_op(lane_bytes)
    for level in range(levels):
        tables.append(_byte_tables(op))
        if level + 1 < levels:
            op = _compose(op, op)
    return tables


def _update_numpy(data) -> int:
    """The raw register after feeding `data` to a register that starts at 0."""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = buf.size
    # Lanes: a power of two, at most 1024 (more lanes make the bulk lookups leave the cache), and at
    # least 64 groups per lane (fewer make the per-group loop overhead dominate).
    k = 1 << max(2, min(10, (n // (64 * _G)).bit_length() - 1))
    lane_bytes = -(-n // (_G * k)) * _G
    total = k * lane_bytes
    padded = np.zeros(total, dtype=np.uint8)
    padded[total - n :] = buf  # leading zeros do not move a register that starts at 0
    s = _advance_lanes(padded.reshape(k, lane_bytes))
    # Combine neighbours pairwise: register(A + B) = zeros_op(len B)(register(A)) ^ register(B).
    for t in _combine_tables(lane_bytes, k.bit_length() - 1):
        s = _apply_tables(t, np.ascontiguousarray(s[0::2])) ^ s[1::2]
    return int(s[0])


_NUMPY_MIN_BYTES = 8192  # below this, pure Python is faster than setting up lanes


def _crc32c_fallback(data, crc: int = 0) -> int:
    n = memoryview(data).nbytes
    if n < _NUMPY_MIN_BYTES:
        return crc32c_pure(data, crc)
    # register(s0, data) = zeros(n)(s0) ^ register(0, data)
    return _shift_zeros(crc ^ _U32, n) ^ _update_numpy(data) ^ _U32


def _load_accelerated():
    """A compiled CRC-32C from an optional package, or None; trusted only if it gets a known vector right."""
    candidates = []
    try:
        import google_crc32c  # type: ignore[import-not-found]

        if getattr(google_crc32c, "implementation", "c") == "c":
            candidates.append(lambda data, crc=0: google_crc32c.extend(crc, bytes(memoryview(data).cast("B"))))
    except ImportError:
        pass
    try:
        import crc32c as _ext  # type: ignore[import-not-found]

        if hasattr(_ext, "crc32c"):
            candidates.append(lambda data, crc=0: _ext.crc32c(data, crc))
    except ImportError:
        pass
    for fn in candidates:
        try:
            if fn(b"123456789") == 0xE3069283 and fn(b"6789", fn(b"12345")) == 0xE3069283:
                return fn
        except Exception:  # an incompatible version: fall back to our own
            continue
    return None


_ACCELERATED = _load_accelerated()
#: Which implementation `crc32c` uses: "accelerated" (an optional compiled package) or "builtin".
IMPLEMENTATION = "accelerated" if _ACCELERATED is not None else "builtin"


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object.

    Args:
        data: bytes, bytearray, memoryview or a C-contiguous NumPy array (its raw bytes are used).
        crc: the CRC of a preceding piece, to extend it (`crc32c(a + b) == crc32c(b, crc32c(a))`).

    Returns:
        The CRC as an unsigned 32-bit int; `crc32c(b"123456789") == 0xE3069283`.
    """
    if _ACCELERATED is not None:
        return _ACCELERATED(data, crc)
    return _crc32c_fallback(data, crc)


def mask(crc: int) -> int:
    """TensorFlow's masking of a stored CRC (rotate right by 15 bits, add a constant)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Inverse of `mask`."""
    rot = (masked - _MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


def masked_crc32c(data) -> int:
    """The masked CRC-32C that TFRecord files and TF checkpoints store."""
    return mask(crc32c(data))


# ----------------------------------------------------------------------------------------------------
# Batches of short messages (TFRecord records): one message per lane.

_ONES_AFTER_ZEROS = [_U32]  # _ONES_AFTER_ZEROS[n]: register 0xFFFFFFFF after n zero bytes
_CACHE_LIMIT = 1 << 16


def _ones_after_zeros(n: int) -> int:
    if n >= _CACHE_LIMIT:
        return _shift_zeros(_U32, n)
    cache = _ONES_AFTER_ZEROS
    if len(cache) <= n:
        with _CACHE_LOCK:
            while len(cache) <= n:
                v = cache[-1]
                cache.append(_T0[v & 0xFF] ^ (v >> 8))
    return cache[n]


_MANY_MAX_BYTES = 1 << 16  # messages longer than this are done one by one


def crc32c_many(messages: Sequence) -> list[int]:
    """CRC-32C of each of many bytes-like messages; much faster than a loop for short messages.

    Args:
        messages: a sequence of bytes-like objects (typically serialized TFRecord payloads).

    Returns:
        A list with `crc32c(m)` for each message, in order.
    """
    if _ACCELERATED is not None or len(messages) < 8:
        return [crc32c(m) for m in messages]
    out: list[int | None] = [None] * len(messages)
    short = []
    for i, m in enumerate(messages):
        if len(m) > _MANY_MAX_BYTES:
            out[i] = crc32c(m)
        else:
            short.append(i)
    if short:
        lengths = [len(messages[i]) for i in short]
        width = max(1, -(-max(lengths) // _G)) * _G
        # Right-align every message in a row of `width` bytes: leading zeros leave a 0 register at 0.
        buf = b"".join(b"\0" * (width - n) + bytes(messages[i]) for i, n in zip(short, lengths))
        raw = _advance_lanes(np.frombuffer(buf, dtype=np.uint8).reshape(len(short), width)).tolist()
        for i, n, r in zip(short, lengths, raw):
            out[i] = _ones_after_zeros(n) ^ r ^ _U32
    return out  # type: ignore[return-value]


def masked_crc32c_many(messages: Sequence) -> list[int]:
    """`masked_crc32c` of each message (see `crc32c_many`)."""
    return [mask(c) for c in crc32c_many(messages)]
