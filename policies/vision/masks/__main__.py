"""``python -m policies.vision.masks ...``: the command of ``cli.py``."""
from .cli import main

if __name__ == "__main__":  # importing this module (e.g. pkgutil.walk_packages) runs nothing
    raise SystemExit(main())
