"""Checkpoints without pickles: safetensors weights + the resolved config as JSON.

Layout of one checkpoint directory::

    model.safetensors        the evaluation weights (EMA when training used EMA), normalizer included
    config.json              {"policy": name, "policy_config": {...}, "cfg": <the run's other settings>}
    training_state.safetensors + training_state.json   optimizer, scheduler, EMA and RNG state (resume only)

``policy_config`` is everything the policy is built from, its task facts and its encoder's
attention included; ``cfg`` is the rest of the training run's config (task, train, eval, seed...),
without the ``policy`` and ``attention`` that policy_config holds, so each setting is stored once.
``read_checkpoint_meta`` gives the run's whole config back (and reads older checkpoints, which
stored both twice, the same way).

Directories are written under a temporary name and renamed, so a crash never leaves a half
checkpoint under a final name.

A checkpoint from elsewhere is data: loading one reads its own four files and nothing else. Its
JSON builds only the policy's architecture (no file it names is read, no download starts: the weights
are all in model.safetensors), its tensors load only where the model has a tensor of that shape, and
its task must be the one its weights were trained on.
"""
from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.paths import inside
from common.resources import is_no_room, no_room

from .base import Policy
from .registry import get_policy_class, make_policy

IN_POLICY_CONFIG = ("policy", "attention")  # the run's settings policy_config holds (the attention: as vit.attention)
# the policy's fields that are its task's facts (core.config.POLICY_REFERENCES): a checkpoint stores them in both
TASK_FACTS = ("input_shapes", "action_dim", "crop_size")
# the first bytes of what torch.save writes (a zip archive, or a bare pickle of protocol 2 and up)
PICKLE_MAGIC = {b"PK\x03\x04": "torch.save (zip) file", b"\x80": "pickle"}
# a safetensors file: the header's length as 8 little-endian bytes, then the JSON header itself; its first
# byte is 0x80 whenever that length is 128 mod 256, so the JSON's opening brace is what tells it from a pickle
SAFETENSORS_HEADER_START = 8


# --- nested python state <-> (flat tensors, JSON skeleton) -------------------------------------
def flatten_state(obj, prefix: str = "", tensors: dict | None = None):
    """Replace every tensor/array in a nested structure by a reference into a flat dict."""
    tensors = {} if tensors is None else tensors
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}, tensors
    if isinstance(obj, np.ndarray):
        tensors[prefix] = torch.from_numpy(np.ascontiguousarray(obj))
        return {"__ndarray__": prefix}, tensors
    if isinstance(obj, dict):
        items = {}
        for k, v in obj.items():
            items[str(k)] = flatten_state(v, f"{prefix}.{k}" if prefix else str(k), tensors)[0]
        return {"__dict__": items, "__intkeys__": all(isinstance(k, int) for k in obj) and bool(obj)}, tensors
    if isinstance(obj, (list, tuple)):
        seq = [flatten_state(v, f"{prefix}.{i}", tensors)[0] for i, v in enumerate(obj)]
        return {"__list__": seq, "__tuple__": isinstance(obj, tuple)}, tensors
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item(), tensors
    return obj, tensors


def unflatten_state(skeleton, tensors: dict):
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__ndarray__" in skeleton:
            return tensors[skeleton["__ndarray__"]].numpy()
        if "__dict__" in skeleton:
            out = {k: unflatten_state(v, tensors) for k, v in skeleton["__dict__"].items()}
            return {int(k): v for k, v in out.items()} if skeleton["__intkeys__"] else out
        if "__list__" in skeleton:
            seq = [unflatten_state(v, tensors) for v in skeleton["__list__"]]
            return tuple(seq) if skeleton["__tuple__"] else seq
    return skeleton


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- writing ----------------------------------------------------------------------------------
def _temporary_dir(final: Path) -> Path:
    """Where ``final`` is written before its rename (``clean_stale_writes`` knows the pattern)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _os_error(exc: Exception) -> Exception:
    """A failed write as an OSError with its errno: safetensors reports one as its own error ("os error 27")."""
    found = re.search(r"os error (\d+)", str(exc)) if isinstance(exc, SafetensorError) else None
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else exc


def _commit_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)


def save_checkpoint(path, policy: Policy, cfg: dict | None = None, training_state: dict | None = None, eval_state_dict: dict | None = None) -> Path:
    """Write one checkpoint directory atomically. ``eval_state_dict`` (EMA weights) replaces the
    policy's own weights in model.safetensors when given."""
    final = Path(path)
    tmp = _temporary_dir(final)
    writing = final  # the file being written, named if the disk has no room for it
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        weights = eval_state_dict if eval_state_dict is not None else policy.state_dict()
        writing = final / "model.safetensors"
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp / writing.name))
        run = {k: v for k, v in (cfg or {}).items() if k not in IN_POLICY_CONFIG}
        meta = {"policy": policy.name, "policy_config": policy.config.to_dict(), "cfg": run}
        writing = final / "config.json"
        (tmp / writing.name).write_text(json.dumps(meta, indent=2))
        if training_state is not None:
            skeleton, tensors = flatten_state(training_state)
            writing = final / "training_state.safetensors"
            save_file(tensors, str(tmp / writing.name))
            writing = final / "training_state.json"
            (tmp / writing.name).write_text(json.dumps(skeleton))
        _commit_dir(tmp, final)
    except (OSError, SafetensorError) as exc:
        if not is_no_room(_os_error(exc)):
            raise
        kept = f" and {final} is still the previous complete checkpoint" if is_complete(final) else ""
        raise no_room(_os_error(exc), writing, f"nothing partial was left{kept}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


def clean_stale_writes(directory: Path) -> None:
    """Finish or drop the writes a kill interrupted (``.NAME.tmp-PID`` / ``.NAME.old-PID`` siblings).

    A kill between the two renames of ``_commit_dir`` leaves the previous checkpoint as ``.old-*``
    and no final directory: it is complete, so it is put back. Everything else stale is deleted.
    """
    for stale in sorted(Path(directory).glob(".*.old-*")):
        final = stale.with_name(stale.name[1:].rsplit(".old-", 1)[0])
        if not final.exists() and is_complete(stale):
            os.replace(stale, final)
        else:
            shutil.rmtree(stale, ignore_errors=True)
    for stale in Path(directory).glob(".*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


# --- reading ----------------------------------------------------------------------------------
CHECKPOINT_FILES = ("model.safetensors", "config.json", "training_state.safetensors", "training_state.json")


def is_complete(path: Path) -> bool:
    return all((Path(path) / f).is_file() for f in CHECKPOINT_FILES)


def own_file(ckpt, name: str) -> Path:
    """One of the checkpoint's files, refused in one line if it is a symbolic link out of the checkpoint:
    loading reads nothing but the checkpoint's own files."""
    return inside(ckpt, name, f"checkpoint {ckpt}: {name}")


def checkpoint_step(path) -> int | None:
    """The training step a checkpoint was written at (None without a readable training state)."""
    try:
        return int(json.loads(own_file(path, "training_state.json").read_text())["__dict__"]["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def newest_checkpoint(checkpoints_dir) -> Path | None:
    """The complete checkpoint of the highest step in a run's checkpoints/ (``last`` on a tie)."""
    best, best_step = None, -1
    root = Path(checkpoints_dir)
    candidates = [root / "last", *sorted(root.glob("step_*"))] if root.is_dir() else []
    for c in candidates:
        step = checkpoint_step(c) if is_complete(c) else None
        if step is not None and step > best_step:
            best, best_step = c, step
    return best


def resolve_checkpoint(path) -> Path:
    """A checkpoint directory, or a run directory (its checkpoints/last is used)."""
    p = Path(path)
    if (p / "model.safetensors").exists():
        return p
    for checkpoints in (p / "checkpoints", p):  # a run directory, or its checkpoints/ folder
        newest = newest_checkpoint(checkpoints)
        if newest is not None:
            return newest
        if (checkpoints / "last" / "model.safetensors").exists():
            return checkpoints / "last"
    raise FileNotFoundError(
        f"no checkpoint at {p}: expected {p}/model.safetensors (a checkpoint directory) or "
        f"{p}/checkpoints/last (a training run directory); train one with python train_policy.py"
    )


def read_checkpoint_meta(path) -> dict:
    """A checkpoint's config.json, its policy config in today's layout (``PolicyConfig.upgrade``)
    and, for a training run's checkpoint, the run's whole config in ``cfg``: its ``policy`` and
    ``attention`` are the policy config's (an older checkpoint's own copies of them were equal)."""
    ckpt = resolve_checkpoint(path)
    meta = json.loads(own_file(ckpt, "config.json").read_text())
    meta["policy_config"] = get_policy_class(meta["policy"]).config_class.upgrade(meta["policy_config"])
    _check_task(ckpt, meta)
    if meta.get("cfg"):
        policy = copy.deepcopy(meta["policy_config"])
        meta["cfg"].update(policy=policy, attention=copy.deepcopy(policy["vit"]["attention"]))
    return meta


def _facts(value):
    """A task fact as compared: input_shapes without its dropped (null) cameras, lists not tuples."""
    if isinstance(value, dict):
        return {k: list(v) for k, v in value.items() if v is not None}
    return value


def _check_task(ckpt: Path, meta: dict) -> None:
    """The run's task (``cfg.task``) and the task facts the policy was built for must agree: a task edited
    to another would roll out weights and a normalizer made for other inputs and actions."""
    task, policy = (meta.get("cfg") or {}).get("task") or {}, meta["policy_config"]
    for key in TASK_FACTS:
        if key in task and _facts(task[key]) != _facts(policy.get(key)):
            raise ValueError(f"checkpoint {ckpt} does not fit its own task: config.json's task {task.get('name')!r} has "
                             f"{key} {_facts(task[key])}, but its weights and normalizer were trained for {key} "
                             f"{_facts(policy.get(key))} (policy_config); the task was edited: restore config.json, or "
                             f"train a policy for that task")


def load_weights(module: torch.nn.Module, state: dict, source) -> None:
    """Load ``state`` into ``module`` strictly, refusing in one line what would not fit: the first tensor
    whose shape differs, or missing / unexpected names (``source``: the file, for the message)."""
    own = module.state_dict()
    for key, tensor in state.items():
        if key in own and tuple(own[key].shape) != tuple(tensor.shape):
            raise ValueError(f"{source} does not fit the model its config.json builds: {key} is "
                             f"{list(tensor.shape)} in the file and {list(own[key].shape)} in the model; the weights "
                             f"and config.json do not belong together: use the checkpoint as train_policy.py wrote it")
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match the model built from its config: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
        )


def load_policy(path, device="cpu", expected_policy: str | None = None, **config_overrides) -> Policy:
    """Rebuild the policy from its saved config and load the evaluation weights."""
    ckpt = resolve_checkpoint(path)
    meta = read_checkpoint_meta(ckpt)
    if expected_policy is not None and meta["policy"] != expected_policy:
        raise ValueError(f"checkpoint {ckpt} holds a {meta['policy']!r} policy, not the requested {expected_policy!r}")
    config = dict(meta["policy_config"])
    config.update(config_overrides)
    config["vit"] = without_downloads(config.get("vit") or {})
    try:
        policy = make_policy(config, name=meta["policy"])
    except ValueError as exc:
        raise ValueError(f"checkpoint {ckpt} cannot be built: {exc}") from None
    load_weights(policy, _load_tensors(own_file(ckpt, "model.safetensors")), ckpt / "model.safetensors")
    return policy.to(device).eval()


def without_downloads(vit: dict) -> dict:
    """A checkpoint's encoder settings with the weights it started from dropped: model.safetensors holds
    every weight, so neither the local file (``vit.pretrained``) nor a download (timm's ``pretrained``)
    is needed, whatever config.json says."""
    timm_kwargs = {k: v for k, v in (vit.get("timm_kwargs") or {}).items() if k != "pretrained"}
    return {**vit, "pretrained": None, "timm_kwargs": timm_kwargs}


def training_state_entry(path, key: str):
    """One tensor-free entry of a checkpoint's training state (None where it has none), tensors not loaded."""
    skeleton = json.loads(own_file(resolve_checkpoint(path), "training_state.json").read_text())
    entry = skeleton.get("__dict__", {}).get(key)
    return None if entry is None else unflatten_state(entry, {})


def load_training_state(path) -> dict:
    ckpt = resolve_checkpoint(path)
    skeleton = json.loads(own_file(ckpt, "training_state.json").read_text())
    return unflatten_state(skeleton, _load_tensors(own_file(ckpt, "training_state.safetensors")))


def _pickle_kind(path: Path) -> str | None:
    """What kind of pickle ``path`` holds, by its first bytes (None: not one, or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(SAFETENSORS_HEADER_START + 1)
    except OSError:
        return None
    if head[SAFETENSORS_HEADER_START:] == b"{":
        return None
    return next((kind for magic, kind in PICKLE_MAGIC.items() if head.startswith(magic)), None)


def _load_tensors(path: Path) -> dict:
    kind = _pickle_kind(path)
    if kind is not None:  # never unpickled: loading a pickle can run any code
        raise ValueError(f"not a safetensors file: {path} is a {kind}, which the package never loads (unpickling can "
                         f"run code); a checkpoint holds what train_policy.py wrote, or convert the weights with "
                         f"safetensors.torch.save_file")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError for a truncated file
        raise ValueError(f"{path} is unreadable ({type(exc).__name__}: {exc}); the file is damaged, "
                         f"evaluate or resume another checkpoint of the run") from None
