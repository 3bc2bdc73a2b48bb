"""A checkpoint from elsewhere is data (issue 42): loading one reads its own files and nothing else, reaches
no network, resolves no interpolation, and anything that does not fit ends in one line naming what; a full
disk during a save ends in one line that names the command that goes on, never a loop between two refusals."""
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

from core.config import TaskConfig, from_dict
from core.training import train
from policies.checkpoint import load_policy, read_checkpoint_meta, save_checkpoint
from policies.registry import make_policy
from policies.vision import swap_attention
from policies.vision.attention import Attention, AttentionConfig
from policies.vision.timm_backbone import TimmViT
from policies.vision.vit import ViTConfig
from tests.helpers import REPO, TINY_ENCODER, TINY_STATS, compose, tiny_overrides, tiny_train_cfg

TIMM_NAME = "vit_tiny_patch16_224"
TIMM_TINY = dict(depth=1, embed_dim=32, num_heads=2)
# the run's task as a checkpoint stores it, matching TINY_ENCODER's task facts
TASK = dict(name="pusht", dataset=dict(path="data/pusht.zarr"), input_shapes=TINY_ENCODER["input_shapes"],
            action_dim=TINY_ENCODER["action_dim"], crop_size=TINY_ENCODER["crop_size"], env=dict(max_episode_steps=10))
HEAD = "obs_encoder.vits.0.head.weight"  # (out_dim 16, embed_dim 32)


class NetworkTouched(BaseException):
    """Raised by the audit hook at the first network call: nothing may even try one."""


class Watch:
    """What the code under watch opened outside the allowed folders, and whether it tried the network
    (``sys.addaudithook``: every ``open`` and ``socket.getaddrinfo``/``connect`` in this process)."""

    def __init__(self):
        self.on, self.allowed, self.opened = False, (), []

    def __call__(self, event, args):
        if not self.on:
            return
        if event in ("socket.getaddrinfo", "socket.connect"):
            self.on = False
            raise NetworkTouched(f"{event} {args[:2]}")
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            code = path.endswith((".py", ".pyc", ".so")) or path.startswith((sys.prefix, sys.base_prefix))
            if not code and not path.startswith(self.allowed):
                self.opened.append(path)


WATCH = Watch()
sys.addaudithook(WATCH)  # hooks cannot be removed: this one only records while WATCH.on


@pytest.fixture
def watch():
    WATCH.opened = []
    yield WATCH
    WATCH.on = False


def _watched(watch, allowed, fn):
    watch.allowed, watch.on = tuple(str(a) for a in allowed), True
    try:
        return fn()
    finally:
        watch.on = False


@pytest.fixture(scope="module")
def timm_checkpoint(tmp_path_factory):
    """A tiny BC policy with a timm ViT encoder, saved as train_policy.py saves one."""
    torch.manual_seed(0)
    vit = dict(TINY_ENCODER["vit"], backbone=f"timm:{TIMM_NAME}", timm_kwargs=TIMM_TINY)
    policy = make_policy(dict(TINY_ENCODER, vit=vit, horizon=8, n_action_steps=4), TINY_STATS, name="bc")
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "last", policy, {"task": TASK})


def _edited(checkpoint, dest, edit):
    """A copy of ``checkpoint`` whose config.json went through ``edit(meta)``."""
    shutil.copytree(checkpoint, dest)
    meta = json.loads((dest / "config.json").read_text())
    edit(meta)
    (dest / "config.json").write_text(json.dumps(meta))
    return dest


def _timm_kwargs(**kwargs):
    return lambda meta: meta["policy_config"]["vit"]["timm_kwargs"].update(kwargs)


# --- 1. a checkpoint builds an architecture: it names no file to read, starts no download ----------------
@pytest.mark.parametrize("key, value", [("checkpoint_path", "OTHER"), ("pretrained_cfg_overlay", {"file": "OTHER"}),
                                        ("cache_dir", "OTHER_DIR")])
def test_a_checkpoint_cannot_make_timm_read_another_file(tmp_path, timm_checkpoint, watch, key, value):
    other = tmp_path / "other.pth"
    torch.save({"x": torch.zeros(1)}, other)  # what torch.load would unpickle (a pickle can run code)
    value = json.loads(json.dumps(value).replace("OTHER_DIR", str(tmp_path)).replace("OTHER", str(other)))
    ckpt = _edited(timm_checkpoint, tmp_path / "ckpt", _timm_kwargs(**{key: value}))
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt} cannot be built: vit.timm_kwargs {key}: not an "
                                         r"architecture setting") as err:
        _watched(watch, [ckpt], lambda: load_policy(ckpt))
    assert "\n" not in str(err.value)
    assert watch.opened == []  # today's code: torch.load(other.pth) through timm's load_checkpoint


def test_a_checkpoint_that_asks_for_a_download_loads_from_its_own_weights_offline(tmp_path, timm_checkpoint, watch):
    """``pretrained`` (timm's hub) and ``vit.pretrained`` (a local file) are what the weights started from;
    model.safetensors holds them all, so loading uses neither: no network, no other file."""
    def edit(meta):
        meta["policy_config"]["vit"].update(pretrained=str(tmp_path / "elsewhere.safetensors"))
        meta["policy_config"]["vit"]["timm_kwargs"]["pretrained"] = True

    ckpt = _edited(timm_checkpoint, tmp_path / "ckpt", edit)
    policy = _watched(watch, [ckpt], lambda: load_policy(ckpt))  # today: the hub, retried for about a minute
    assert watch.opened == []
    saved = load_file(str(ckpt / "model.safetensors"))
    torch.testing.assert_close(policy.state_dict()[HEAD], saved[HEAD], rtol=0, atol=0)


def test_a_download_asked_for_on_the_command_line_is_one_line_at_once(watch):
    cfg = ViTConfig(patch_size=8, backbone=f"timm:{TIMM_NAME}", timm_kwargs=dict(TIMM_TINY, pretrained=True))
    with pytest.raises(ValueError, match=r"vit.timm_kwargs.pretrained would download the weights of 'vit_tiny_patch16_224'.*"
                                         r"huggingface-cli download timm/vit_tiny_patch16_224\.\S+ model.safetensors.*"
                                         r"policy.vit.pretrained=") as err:
        _watched(watch, [], lambda: TimmViT(cfg, 24))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_checkpoint_file_linked_out_of_the_checkpoint_is_not_read(tmp_path, timm_checkpoint, watch, name):
    ckpt = shutil.copytree(timm_checkpoint, tmp_path / "ckpt")
    outside = tmp_path / f"elsewhere_{name}"  # a file of the user's: the link makes the checkpoint point at it
    (ckpt / name).rename(outside)
    (ckpt / name).symlink_to(outside)
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt}: {name} \({name}\) leads outside {ckpt}") as err:
        _watched(watch, [ckpt], lambda: load_policy(ckpt))
    assert "\n" not in str(err.value) and watch.opened == []


# --- 2. no interpolation in a checkpoint is resolved -----------------------------------------------------
@pytest.mark.parametrize("path", ["${oc.env:HOME}", "${oc.env:HOME}/data", "a\\${oc.env:HOME}", "a\\\\${oc.env:HOME}",
                                  "${task.name}", "${", "data/pusht.zarr"])
def test_checkpoint_strings_are_literals(tmp_path, timm_checkpoint, monkeypatch, path):
    monkeypatch.setenv("HOME", "/home/secret-user")
    ckpt = _edited(timm_checkpoint, tmp_path / "ckpt", lambda meta: meta["cfg"]["task"]["dataset"].update(path=path))
    task = from_dict(TaskConfig, read_checkpoint_meta(ckpt)["cfg"]["task"])  # as rollout.py reads it
    assert task.dataset.path == path  # today: "/home/secret-user", or an error for the others


def test_a_value_of_the_wrong_type_is_one_line():
    with pytest.raises(ValueError, match=r"TaskConfig at action_dim: .*could not be converted to Integer") as err:
        from_dict(TaskConfig, dict(TASK, action_dim="${oc.env:HOME}"))
    assert "\n" not in str(err.value)


# --- 3. what does not fit is one line naming what ---------------------------------------------------------
def test_a_pickle_named_safetensors_is_never_unpickled(tmp_path, timm_checkpoint, monkeypatch):
    ckpt = shutil.copytree(timm_checkpoint, tmp_path / "ckpt")
    torch.save({k: v.clone() for k, v in load_file(str(timm_checkpoint / "model.safetensors")).items()},
               ckpt / "model.safetensors")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(ValueError, match=rf"not a safetensors file: {ckpt}/model.safetensors is a torch.save \(zip\) "
                                         r"file, which the package never loads") as err:
        load_policy(ckpt)
    assert "\n" not in str(err.value)


def test_a_safetensors_file_whose_header_length_starts_like_a_pickle_loads(tmp_path):
    """Its first byte is the header length's low byte: 0x80 (a pickle's first byte) for 1 length in 256."""
    from policies.checkpoint import _load_tensors

    path, tensors = tmp_path / "model.safetensors", {"w": torch.arange(6.0).reshape(2, 3)}
    for pad in range(256):  # the metadata's length moves the header's length through every value mod 256
        save_file(tensors, str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[0] == 0x80:
            break
    assert path.read_bytes()[0] == 0x80
    assert torch.equal(_load_tensors(path)["w"], tensors["w"])


def test_weights_of_other_shapes_name_the_first_tensor_and_both_shapes(tmp_path, timm_checkpoint):
    ckpt = shutil.copytree(timm_checkpoint, tmp_path / "ckpt")
    state = {k: v.clone() for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    state[HEAD] = torch.zeros(17, 32)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{HEAD} is \[17, 32\] in the file and \[16, 32\] in the model") as err:
        load_policy(ckpt)  # today: torch's several-line RuntimeError
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit, key", [
    (dict(name="lift", input_shapes={"agentview_image": [3, 84, 84], "robot0_eef_pos": [3]}, action_dim=7), "input_shapes"),
    (dict(action_dim=7), "action_dim"),
    (dict(crop_size=16), "crop_size"),
])
def test_a_checkpoint_whose_task_was_edited_says_which_fact_does_not_fit(tmp_path, timm_checkpoint, edit, key):
    ckpt = _edited(timm_checkpoint, tmp_path / "ckpt", lambda meta: meta["cfg"]["task"].update(edit))
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt} does not fit its own task: .* has {key} .* but its "
                                         rf"weights and normalizer were trained for {key}") as err:
        read_checkpoint_meta(ckpt)
    assert "\n" not in str(err.value)


def test_a_backbone_that_is_not_a_vit_names_one():
    with pytest.raises(ValueError, match=r"vit.backbone='timm:resnet18' is a ResNet, and the policy's camera encoder "
                                         r"needs a timm VisionTransformer: name one, e.g. "
                                         r"policy.vit.backbone=timm:vit_tiny_patch16_224") as err:
        TimmViT(ViTConfig(patch_size=8, backbone="timm:resnet18"), 24)  # today: "... unexpected keyword 'img_size'"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("size, pad", [((96, 192), False), ((192, 96), False), ((90, 200), True)])
def test_swapped_attention_uses_the_models_own_grid_on_non_square_images(monkeypatch, size, pad):
    model = timm.create_model(TIMM_NAME, pretrained=False, img_size=96, patch_size=16, num_classes=0,
                              dynamic_img_size=True, dynamic_img_pad=pad, **TIMM_TINY)
    swap_attention(model, AttentionConfig(kind="fibottention"))
    used = []
    forward = Attention.forward
    monkeypatch.setattr(Attention, "forward", lambda self, x, grid, prefix: used.append(grid) or forward(self, x, grid, prefix))
    model(torch.rand(1, 3, *size))
    # 96 x 192 with 16-px patches is 6 x 12 (today: 9 x 8, the squarest factorisation of 72)
    assert used == [tuple(model.patch_embed.dynamic_feat_size(size))]


# --- 4. a full disk during a save: one line, the old checkpoint intact, and a way on ---------------------
NO_ROOM_BYTES = 100_000  # room for config.json and TensorBoard's events; not for a checkpoint's weights


def _no_room():
    """``ulimit -f``: a write past NO_ROOM_BYTES fails with EFBIG (Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (NO_ROOM_BYTES, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_full_disk_at_the_first_save_is_one_line_and_overwrite_is_the_way_on(tmp_path, tiny_pusht_zarr):
    run_dir = tmp_path / "run"
    args = tiny_overrides(tmp_path, tiny_pusht_zarr, policy="bc")
    proc = subprocess.run([sys.executable, "train_policy.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, preexec_fn=_no_room, env={**os.environ, "OMP_NUM_THREADS": "1"})
    last_line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last_line.startswith(f"train_policy.py: error: could not write {run_dir}/checkpoints/step_0000002/"
                                "model.safetensors: file too large (a full disk, a quota or ulimit -f); nothing partial "
                                "was left; the run has no complete checkpoint: overwrite=true starts it over"), last_line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == []  # no half checkpoint, no temporary
    # with and without resume=true, the way on is overwrite=true (today: each sends the user to the other)
    with pytest.raises(FileExistsError, match=r"stopped before its first complete checkpoint.*overwrite=true starts it over"):
        train(compose(args))
    with pytest.raises(FileNotFoundError, match=r"nothing to resume; overwrite=true starts it over \(it deletes .run, "
                                                r"checkpoints, config.json, environment.json, tb, eval in .* and nothing else\)"):
        train(compose([*args, "resume=true"]))
    assert train(compose([*args, "overwrite=true"])).step == 2


def test_a_full_disk_keeps_the_previous_checkpoint_and_resume_is_the_way_on(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc"))
    last = tmp_path / "run" / "checkpoints" / "last"
    before = {p.name: p.read_bytes() for p in last.iterdir()}
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    _no_room()
    try:
        with pytest.raises(ValueError, match=rf"could not write .*step_0000004/model.safetensors: file too large .*; "
                                             rf"nothing partial was left; the newest complete checkpoint is {last} "
                                             rf"\(step 2\): resume=true continues from it") as err:
            train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["resume=true", "train.steps=4"]))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in last.iterdir()} == before  # intact, byte for byte
    assert sorted(p.name for p in last.parent.iterdir()) == ["last", "step_0000002"]
    assert train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["resume=true", "train.steps=4"])).step == 4
