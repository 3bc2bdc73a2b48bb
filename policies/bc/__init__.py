from .modeling import BCPolicy  # noqa: F401  (registers 'bc')
