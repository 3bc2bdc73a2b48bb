"""Run by tests/test_distributed.py under torchrun: train, then dump this rank's parameters."""
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import tiny_train_cfg  # noqa: E402
from train_policy import train  # noqa: E402

tmp, data = Path(sys.argv[1]), sys.argv[2]
cfg = tiny_train_cfg(tmp, data, extra=sys.argv[3:])
result = train(cfg)
rank = dist.get_rank() if dist.is_initialized() else 0
save_file({k: v.detach().contiguous() for k, v in result.policy.state_dict().items()}, str(tmp / f"params_rank{rank}.safetensors"))
if dist.is_initialized():
    dist.destroy_process_group()
