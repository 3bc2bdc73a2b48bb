"""Train a policy from demonstrations.

    python train_policy.py task=lift policy=bc attention=fibottention            # recipe=cpu is the default
    python train_policy.py task=pusht policy=diffusion attention=lookhere recipe=paper
    python train_policy.py ... resume=true          # continue run_dir from its newest complete checkpoint
    torchrun --nproc_per_node=2 train_policy.py ...  # DistributedDataParallel (gloo on CPU, NCCL on GPU)

Options: configs/config.yaml and the dataclasses it names; `python train_policy.py --cfg job` prints them.
"""
from core.cli import check_overrides, quiet_ctrl_c, run_command

quiet_ctrl_c("train_policy.py")  # first: a Ctrl-C during the imports below (seconds) ends in one line too

import hydra  # noqa: E402
from core.config import register_configs  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg) -> None:
    from core.training import run

    run_command("train_policy.py", run, cfg)


if __name__ == "__main__":
    check_overrides("train_policy.py", "config")  # a bad override in one line, before Hydra's several
    main()
