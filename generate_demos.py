"""Generate demonstrations with a task's scripted expert, in the format training reads.

    python generate_demos.py task=lift num_episodes=200 workers=2          # out= defaults to the task's dataset path
    python generate_demos.py task=pusht num_episodes=200 out=data/pusht/demos.zarr workers=2

Options: GenerateConfig in datasets/generate.py (the library this calls); `python generate_demos.py
task=lift --cfg job` prints them.
"""
from core.cli import main

if __name__ == "__main__":
    main("generate_demos.py", "generate", "datasets.generate:run")  # core/cli.py: the entry points' one convention
