"""The device and torchrun's process layout: rank 0 alone logs, writes checkpoints and runs rollouts."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={name} but no CUDA device is visible; use device=auto or device=cpu")
        return torch.device(name) if ":" in name else torch.device("cuda", local_rank)
    return torch.device(name)


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_env(device_name: str) -> "Distributed":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return Distributed()
        if not dist.is_initialized():
            use_nccl = torch.cuda.is_available() and device_name != "cpu"
            dist.init_process_group(backend="nccl" if use_nccl else "gloo")
        return Distributed(dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()
