"""Run by tests/test_distributed.py under torchrun (-m tests.ddp_worker): train, then dump this rank's parameters."""
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file

from core.training import train
from tests.helpers import tiny_train_cfg

tmp, data = Path(sys.argv[1]), sys.argv[2]
result = train(tiny_train_cfg(tmp, data, extra=sys.argv[3:]))
rank = dist.get_rank() if dist.is_initialized() else 0
save_file({k: v.detach().contiguous() for k, v in result.policy.state_dict().items()}, str(tmp / f"params_rank{rank}.safetensors"))
if dist.is_initialized():
    dist.destroy_process_group()
