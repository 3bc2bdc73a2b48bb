"""``AttentionCache``: what one attention module builds for a grid, kept by that module.

A dense bias is (heads, N, N) floats (8 heads at N = 4096: 512 MiB) and a sparse plan holds
index tensors of size O(heads * N * slots): they belong to the model that uses them, not to a
process-wide ``functools.lru_cache`` that would keep them alive after the model is gone, on
whatever device they were first built for. ``attention.Attention`` owns one cache, clears it in
``_apply`` (``.to()``, ``.cuda()``, ``.double()``, ...) and in ``clear_attention_cache()``; the
dense path of ``attention.py`` and the sparse kernels of this package store their tensors here.
Pure-python plans (lists of offsets) may still use ``lru_cache``: they hold no tensors.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor inside a (nested) tuple / NamedTuple / list / dict, or None."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


class AttentionCache:
    """Entries keyed by anything hashable (e.g. ``("dense", pattern, grid, num_prefix, dtype)``),
    each stored with the device its tensors live on. ``get`` rebuilds an entry whose device is
    not the one asked for, so a stale device is never used even without ``clear()``."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[torch.device | None, Any]] = {}

    def get(self, key: Hashable, device: torch.device, build: Callable[[], Any]) -> Any:
        """The entry for ``key`` on ``device``, built by ``build()`` when missing or elsewhere."""
        entry = self._entries.get(key)
        if entry is not None and (entry[0] is None or entry[0] == device):
            return entry[1]
        value = build()
        tensor = first_tensor(value)
        self._entries[key] = (None if tensor is None else tensor.device, value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    # A copy of the model (deepcopy for an EMA, pickling with torch.save(model)) gets an empty
    # cache: the entries are derived data, rebuilt on first use, and a dense bias can be huge.
    def __deepcopy__(self, memo) -> AttentionCache:
        return AttentionCache()

    def __getstate__(self) -> dict:
        return {"_entries": {}}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def values(self) -> list[Any]:
        return [value for _, value in self._entries.values()]
