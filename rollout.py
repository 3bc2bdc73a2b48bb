"""Roll a trained policy out in simulation and report its success rate.

    python rollout.py checkpoint=outputs/lift/bc_fibottention_s0 num_episodes=50 workers=2
    python rollout.py checkpoint=RUN image_size=112 global_slope=0.75      # inference-time changes

Prints and writes summary.json (success rate with a 95% Wilson interval, mean max reward, episode
lengths, every episode's seed and outcome) and videos, in a folder of its own under <run>/eval/.
Options: RolloutConfig in core/config.py.
"""
from core.cli import check_overrides, quiet_ctrl_c, run_command

quiet_ctrl_c("rollout.py")  # first: a Ctrl-C during the imports below (seconds) ends in one line too

import hydra  # noqa: E402
from core.config import register_configs  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="rollout")
def main(cfg) -> None:
    from core.evaluation import run

    run_command("rollout.py", run, cfg)


if __name__ == "__main__":
    check_overrides("rollout.py", "rollout")  # a bad override in one line, before Hydra's several
    main()
