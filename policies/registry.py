"""The policy registry: a policy's name -> its class. The policy folders import only the interface
(``policies.base``), and this module imports them, so no import goes back; adding a policy is one
folder and one line in ``POLICIES``."""
from __future__ import annotations

import dataclasses

from .base import Policy, PolicyConfig
from .bc.modeling import BCPolicy
from .bc_rnn.modeling import BCRNNPolicy
from .diffusion.modeling import DiffusionPolicy

POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (BCPolicy, BCRNNPolicy, DiffusionPolicy)}


def get_policy_class(name: str) -> type[Policy]:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


def make_policy_config(name: str, **fields) -> PolicyConfig:
    cls = get_policy_class(name).config_class
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"policy {name!r} has no config fields {unknown}; known fields: {sorted(known)}")
    return cls(**fields)


def make_policy(config: PolicyConfig | dict, stats=None, name: str | None = None) -> Policy:
    """Build the policy a config names (a dict, as read from a checkpoint, needs ``name``)."""
    if isinstance(config, dict):
        config = make_policy_config(name or config["name"], **{k: v for k, v in config.items() if k != "name"})
    policy = get_policy_class(config.name)(config)
    if stats is not None:
        policy.set_normalization(stats)
    return policy
