"""Policies: one folder each (configuration + modeling), found by name through the registry in
``policies.registry`` (``make_policy``, ``get_policy_class``). Nothing is imported here, so that
``python -m policies.vision.masks`` runs without loading the policy stack first."""
