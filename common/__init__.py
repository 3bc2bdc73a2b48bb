"""The lowest layer: helpers every room may use, importing nothing of the package (tests/test_layers.py)."""
