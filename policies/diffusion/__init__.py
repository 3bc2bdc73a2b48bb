from .modeling import DiffusionPolicy  # noqa: F401  (registers 'diffusion')
