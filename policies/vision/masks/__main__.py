"""``python -m policies.vision.masks ...``: the command of ``cli.py``."""
from .cli import main

raise SystemExit(main())
