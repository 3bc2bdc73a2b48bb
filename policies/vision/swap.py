"""Put the package's attention (full, Fibottention, LookHere, BigBird) into a timm VisionTransformer.

``swap_attention(model, attention)`` replaces every block's timm ``Attention`` by a
``SwappedAttention``: the package's ``Attention`` module reusing the block's own ``qkv`` and
``proj`` layers (the same parameters, so weights loaded before the swap are kept and the state
dict keys do not change), with the pattern of that block's layer (Fibottention's per-layer head
shuffle, LookHere's per-layer slopes). timm's blocks call ``attn(x)`` with the tokens only; the
swapped module knows the model's prefix tokens (CLS and registers come first in timm, as in our
masks) and takes the patch grid from the model's own patch embedding (a hook records the grid of
each image it embeds, ``patch_embed.dynamic_feat_size``), so images of another size or shape work
when the model resamples its position embedding (``dynamic_img_size=True``): a 96 x 192 image with
8-px patches is 12 x 24 patches, never a squarer factorisation of its 288 tokens.
"""
from __future__ import annotations

import math

import torch
from timm.layers import Attention as TimmAttention
from torch import nn

from .attention import Attention, AttentionConfig


def token_grid(num_patches: int, built: tuple[int, int]) -> tuple[int, int]:
    """The (rows, cols) grid of ``num_patches`` tokens: ``built`` (the grid the model was made for)
    when it fits, else the factorisation closest to its aspect ratio (a larger render of the
    same camera)."""
    if built[0] * built[1] == num_patches:
        return built
    ratio = built[0] / built[1]
    pairs = [(r, num_patches // r) for r in range(1, num_patches + 1) if num_patches % r == 0]
    return min(pairs, key=lambda rc: abs(math.log(rc[0] / rc[1] / ratio)))


class PatchGrid:
    """The (rows, cols) patch grid of the image the model embeds now, shared by its swapped attentions:
    a forward pre-hook on ``patch_embed`` sets it from the image's size, as timm's patch embedding
    computes it (``dynamic_feat_size``: floored, or ceiled with ``dynamic_img_pad``)."""

    def __init__(self, built: tuple[int, int]):
        self.built = tuple(built)
        self.current: tuple[int, int] | None = None

    def __call__(self, patch_embed: nn.Module, args: tuple) -> None:
        size = tuple(args[0].shape[-2:])  # the images (B, C, H, W)
        feat_size = getattr(patch_embed, "dynamic_feat_size", None)
        self.current = tuple(int(g) for g in feat_size(size)) if feat_size is not None else self.built

    def of(self, num_patches: int) -> tuple[int, int]:
        """The grid of ``num_patches`` tokens: the embedded image's; for tokens given to a block directly
        (no image), the built grid or the factorisation nearest its aspect ratio."""
        if self.current is not None and self.current[0] * self.current[1] == num_patches:
            return self.current
        return token_grid(num_patches, self.built)


def _check_plain(attn: nn.Module, index: int) -> None:
    """One-line refusal of anything but timm's plain ``Attention`` (the only one we can reproduce)."""
    if isinstance(attn, SwappedAttention):
        raise ValueError(f"block {index}'s attention is already swapped; build the timm model again to swap it to another kind")
    if type(attn) is not TimmAttention:
        raise ValueError(f"swap_attention needs timm's Attention in every block; block {index} has "
                         f"{type(attn).__module__}.{type(attn).__name__}: use a plain timm VisionTransformer (vit_*)")
    extras = [name for name in ("q_norm", "k_norm", "norm") if not isinstance(getattr(attn, name, None), (nn.Identity, type(None)))]
    if getattr(attn, "gate", None) is not None:
        extras.append("gate")
    if extras or attn.num_heads * attn.head_dim != attn.qkv.in_features:
        raise ValueError(f"block {index}'s attention has {', '.join(extras) or 'a head width other than dim / heads'}, "
                         "which the package's attention does not reproduce: build the model without them")


class SwappedAttention(Attention):
    """The package's ``Attention`` with timm's call signature, ``forward(x)``, around a timm
    block's ``qkv``/``proj`` layers and dropouts."""

    def __init__(self, timm_attn: TimmAttention, pattern, impl: str, mask_mode: str, num_prefix: int, grid: PatchGrid):
        dim = timm_attn.qkv.in_features
        with torch.device("meta"):  # the layers built here are replaced at once: allocate and draw nothing
            super().__init__(dim, timm_attn.num_heads, pattern, impl, attn_drop=timm_attn.attn_drop.p, mask_mode=mask_mode)
        self.qkv, self.proj, self.proj_drop = timm_attn.qkv, timm_attn.proj, timm_attn.proj_drop
        self.num_prefix = num_prefix
        self.patch_grid = grid  # the model's: the grid of the image being embedded

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """x (B, prefix + P, dim) -> (B, prefix + P, dim)."""
        if attn_mask is not None or is_causal:
            raise ValueError("a swapped attention takes its mask from attention.kind: call the model without attn_mask / is_causal")
        grid = self.patch_grid.of(x.shape[1] - self.num_prefix)
        return self.proj_drop(super().forward(x, grid, self.num_prefix))


def swap_attention(model: nn.Module, attention: AttentionConfig) -> nn.Module:
    """Replace the attention of every block of a timm ``VisionTransformer`` in place; returns the model.

    With ``attention.kind="full"`` the model computes what it computed before. A pattern that
    carries position itself (LookHere) also removes the model's position embedding, as the paper
    does: load pretrained weights before swapping."""
    blocks = list(getattr(model, "blocks", None) or [])
    if not blocks or not all(hasattr(b, "attn") for b in blocks) or not hasattr(model, "patch_embed"):
        raise ValueError(f"swap_attention needs a timm VisionTransformer (patch_embed, blocks[i].attn), not {type(model).__name__}")
    for i, block in enumerate(blocks):
        _check_plain(block.attn, i)
    num_prefix = int(getattr(model, "num_prefix_tokens", 0))
    grid = PatchGrid(tuple(int(g) for g in model.patch_embed.grid_size))
    model.patch_embed.register_forward_pre_hook(grid)
    patterns = [attention.pattern(block.attn.num_heads, layer, len(blocks)) for layer, block in enumerate(blocks)]
    for block, pattern in zip(blocks, patterns):
        block.attn = SwappedAttention(block.attn, pattern, attention.impl, attention.mask_mode, num_prefix, grid)
    if not patterns[0].uses_pos_embed and getattr(model, "pos_embed", None) is not None:
        model.pos_embed = None  # timm's _pos_embed then only prepends the prefix tokens
    return model
