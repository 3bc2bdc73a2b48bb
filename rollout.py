"""Roll a trained policy out in simulation and report its success rate.

    python rollout.py checkpoint=outputs/lift/bc_fibottention_s0 num_episodes=50 workers=2
    python rollout.py checkpoint=RUN image_size=112 global_slope=0.75      # inference-time changes

Prints and writes summary.json (success rate with a 95% Wilson interval, mean max reward, episode
lengths, every episode's seed and outcome) and videos, in a folder of its own under <run>/eval/.
Options: RolloutConfig in core/config.py.
"""
from core.cli import main

if __name__ == "__main__":
    main("rollout.py", "rollout", "core.evaluation:run")  # core/cli.py: the entry points' one convention
