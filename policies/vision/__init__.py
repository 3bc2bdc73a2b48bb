"""The ViT encoders and their attention. ``swap_attention`` puts the package's attention into a
timm VisionTransformer (docs/timm.md); it is loaded on first use, so importing the package's own
ViT does not import timm."""


def __getattr__(name: str):
    if name == "swap_attention":
        from .swap import swap_attention

        return swap_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["swap_attention"]
