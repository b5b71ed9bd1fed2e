"""Where a process runs: its device, and under `torchrun` its rank in the process group (`torch.distributed`,
NCCL on CUDA, gloo on CPU), with the model wrapped for data parallelism (DDP or FSDP) and the forward pass's
mixed precision. Used by every training run and, for the device alone, by inference.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bert.errors import InputError

logger = logging.getLogger(__name__)


@dataclass
class DistContext:
    """Where this process runs: its rank among `world_size` processes and its device."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks, in place (a no-op in a single process)."""
        if self.distributed:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (all ranks receive the list)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def all_gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` ([n, ...], the same shape on each), concatenated in rank order, differentiably:
        the gradient of the gathered rows goes back to the rank each came from, summed over the ranks that
        used them (a single process: `t` itself)."""
        return _AllGatherRows.apply(t) if self.distributed else t


class _AllGatherRows(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums every rank's gradient of the gathered rows and keeps this
    rank's slice. An all-reduce rather than a reduce-scatter: gloo has no reduce-scatter."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, t.contiguous())
        ctx.rows = t.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()  # reduced in place: autograd may hold the incoming one
        torch.distributed.all_reduce(grad, op=torch.distributed.ReduceOp.SUM)
        start = torch.distributed.get_rank() * ctx.rows
        return grad[start : start + ctx.rows]


def resolve_device(spec: str | None, local_rank: int = 0) -> torch.device:
    """`spec` as a torch device; None or "auto" is CUDA (this process's local GPU) if available, else CPU."""
    if spec in (None, "", "auto"):
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InputError(f"--device={spec} is not a torch device; use cpu, cuda, cuda:1, ...") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device={spec}: CUDA is not available on this machine; use --device=cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


_PROCESS_GROUPS: list[Any] = []  # see init_distributed


def init_distributed(device_spec: str | None = None) -> DistContext:
    """Join the process group when started by `torchrun` (WORLD_SIZE > 1), else a single process.

    The backend is NCCL on CUDA and gloo on CPU. Each process uses GPU `LOCAL_RANK`.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_spec, local_rank)
    if world_size > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        # Under an elastic torchrun the workers may share the agent's store across restarts, where a dead
        # worker's address from the failed attempt can outlive it: each attempt gets its own key space.
        store, _, _ = next(torch.distributed.rendezvous("env://", rank=rank, world_size=world_size))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = torch.distributed.PrefixStore(f"bert/attempt-{attempt}", store)
        torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)
        # Held until the process ends. Otherwise, once `shutdown_distributed` has let go of it, the group is
        # destroyed when the DDP wrapper is freed, on the main thread holding the GIL: gloo's destructor then
        # joins its worker thread, which may still be freeing the last collective's tensors and wait for the
        # GIL (a hang seen at the end of `bert pretrain` under torchrun).
        _PROCESS_GROUPS.append(torch.distributed.group.WORLD)
        logger.info("rank %d of %d joined the %s process group on %s", rank, world_size, backend, device)
    return DistContext(device=device, rank=rank, world_size=world_size, local_rank=local_rank)


def holds_process_group() -> bool:
    """Whether this process joined a process group (`init_distributed`), which it holds until it ends."""
    return bool(_PROCESS_GROUPS)


def shutdown_distributed() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass (fp32: none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def wrap_model(model: nn.Module, dist: DistContext, fsdp: bool = False) -> nn.Module:
    """Move `model` to the device and, under torchrun, wrap it for data parallelism.

    DDP replicates the model; FSDP (PyTorch's `fully_shard`, one unit per encoder block plus the root)
    shards parameters, gradients and optimizer state. FSDP changes `model` in place (its parameters
    become sharded DTensors), so build the optimizer after this call, from `model.named_parameters()`.
    """
    model.to(dist.device)
    if not dist.distributed:
        return model
    if fsdp:
        # Imported here, not with the module: torch.distributed.fsdp brings torch._dynamo and took 0.5 s of every
        # command's start-up, `bert embed` of one line included (3.0 s in all; bench/RESULTS.md).
        from torch.distributed.fsdp import fully_shard

        # Our outputs are never modified in place, which is what this warning is about.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

        for m in model.modules():
            if type(m).__name__ == "BertLayer":
                fully_shard(m)
        fully_shard(model)
        return model

    ids = [dist.device.index] if dist.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


@contextlib.contextmanager
def distributed(device_spec: str | None = None) -> Iterator[DistContext]:
    """`init_distributed` for the duration of a run; the process group is left at the end."""
    dist = init_distributed(device_spec)
    try:
        yield dist
    finally:
        shutdown_distributed()
