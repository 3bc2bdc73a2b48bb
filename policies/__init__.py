"""Policies: one folder each (configuration + modeling), found by name through the registry."""
from .base import POLICIES, Policy, PolicyConfig, get_policy_class, make_policy, make_policy_config  # noqa: F401
