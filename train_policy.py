"""Train a policy from demonstrations.

    python train_policy.py task=lift policy=bc attention=fibottention            # recipe=cpu is the default
    python train_policy.py task=pusht policy=diffusion attention=lookhere recipe=paper
    python train_policy.py ... resume=true          # continue run_dir from its newest complete checkpoint
    torchrun --nproc_per_node=2 train_policy.py ...  # DistributedDataParallel (gloo on CPU, NCCL on GPU)

Options: configs/config.yaml and the dataclasses it names; `python train_policy.py --cfg job` prints them.
"""
from core.cli import main

if __name__ == "__main__":
    main("train_policy.py", "config", "core.training:run")  # core/cli.py: the entry points' one convention
