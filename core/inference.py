"""Inference-time options (``InferenceOverrides``) -> the changes they make to a checkpoint's policy config.

A trained policy is changed at rollout without retraining: the DDIM steps, how often it replans (Ta)
and the attention settings that only act on the masks (LookHere's global slope, Fibottention's window
and offset grid). An option the checkpoint cannot take is an ``OverrideError``, one line for the CLI.
Which attention kind owns a setting is its pattern's business (``masks.settings_of``), not this module's.
"""
from __future__ import annotations

from dataclasses import fields

from policies.registry import get_policy_class
from policies.vision.attention import AttentionConfig
from policies.vision.masks import KINDS, settings_of
from policies.vision.vit import patch_grid

from .config import InferenceOverrides

# the options that are attention settings: the fields InferenceOverrides shares with AttentionConfig
ATTENTION_OPTIONS = tuple(f.name for f in fields(InferenceOverrides)
                          if f.name in {a.name for a in fields(AttentionConfig)})


class OverrideError(ValueError):
    """A rollout override that does not fit the checkpoint: the CLI prints it as one line."""


def owning_kind(setting: str) -> str:
    return next(kind for kind in KINDS if setting in settings_of(kind))


def attention_changes(policy_config: dict, inference: InferenceOverrides) -> dict:
    """The attention settings ``inference`` changes, checked against the checkpoint's attention kind."""
    vit = policy_config["vit"]
    kind = vit["attention"]["kind"]
    changes = {name: getattr(inference, name) for name in ATTENTION_OPTIONS if getattr(inference, name) is not None}
    if changes.get("offset_grid") == "train":  # keep the 2-D displacements the 1-D offsets had on the training grid
        changes["offset_grid"] = list(patch_grid(policy_config["crop_size"], vit["patch_size"]))
    for name in changes:
        owner = owning_kind(name)
        if owner != kind:
            raise OverrideError(f"{name}= applies to {owner} attention, but this checkpoint uses {kind!r}; "
                                f"drop {name}=")
    return changes


def policy_overrides(meta: dict, inference: InferenceOverrides) -> tuple[dict, dict]:
    """The checkpoint's policy config fields ``inference`` changes -> (``load_policy``'s overrides, the
    attention settings changed); a change that does not fit the checkpoint is an OverrideError."""
    policy_config, name = meta["policy_config"], meta["policy"]
    overrides = {}
    if inference.num_inference_steps is not None:
        if "num_inference_steps" not in policy_config:
            raise OverrideError(f"num_inference_steps= applies to diffusion policies, but this checkpoint holds "
                                f"{name!r}; drop num_inference_steps=")
        overrides["num_inference_steps"] = inference.num_inference_steps
    ta = inference.n_action_steps
    if ta is not None:  # Ta only acts at inference, unless the network outputs exactly Ta actions
        trained_ta = policy_config["n_action_steps"]
        if ta != trained_ta and not get_policy_class(name).config_class.inference_action_steps:
            raise OverrideError(f"n_action_steps= cannot change at rollout for a {name!r} checkpoint (its network "
                                f"outputs {trained_ta} actions per step); drop n_action_steps= or retrain with "
                                f"policy.n_action_steps=")
        overrides["n_action_steps"] = ta
    attention = attention_changes(policy_config, inference)
    if attention:
        vit = policy_config["vit"]
        overrides["vit"] = {**vit, "attention": {**vit["attention"], **attention}}
    return overrides, attention
