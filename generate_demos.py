"""Generate demonstrations with a task's scripted expert, in the format training reads.

    python generate_demos.py task=lift num_episodes=200 workers=2          # out= defaults to the task's dataset path
    python generate_demos.py task=pusht num_episodes=200 out=data/pusht/demos.zarr workers=2

Options: GenerateConfig in datasets/generate.py (the library this calls); `python generate_demos.py
task=lift --cfg job` prints them.
"""
from core.cli import check_overrides, quiet_ctrl_c, run_command

quiet_ctrl_c("generate_demos.py")  # first: a Ctrl-C during the imports below (seconds) ends in one line too

import hydra  # noqa: E402
from core.config import register_configs  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="generate")
def main(cfg) -> None:
    from datasets.generate import run

    run_command("generate_demos.py", run, cfg)


if __name__ == "__main__":
    check_overrides("generate_demos.py", "generate")  # a bad override in one line, before Hydra's several
    main()
