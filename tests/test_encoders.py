"""The camera encoders beside the ViT (the ResNet-18 baseline, ``encoder=resnet18``) and the training
augmentation every encoder sees (``policy.image_aug``: shift, hue, saturation), for every policy."""
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.training import train
from datasets.factory import make_dataset
from datasets.sampler import SequenceDataset, compute_stats
from policies.checkpoint import load_policy, read_checkpoint_meta
from policies.obs_encoder import ImageAugConfig
from policies.registry import POLICIES, make_policy
from policies.vision.resnet import GROUP_NORM_CHANNELS, ResNet18, ResNetConfig
from tests.helpers import compose, tiny_overrides

POLICY_NAMES = sorted(POLICIES)
# one override list per camera encoder, the timm ViT shrunk to one narrow block
ENCODERS = {
    "vit": [],
    "timm": ["policy.vit.backbone=timm:vit_tiny_patch16_224", "policy.vit.pool=mean", "+policy.vit.timm_kwargs.depth=1",
             "+policy.vit.timm_kwargs.embed_dim=32", "+policy.vit.timm_kwargs.num_heads=2"],
    "resnet18": ["encoder=resnet18"],
}
IMAGE_SIZE = 96  # tiny_pusht_zarr's frames
SHIFT = 4
RESNET_CROP = 48  # a 2 x 2 feature map: a ResNet-18 step in a second or two on the shared CPU


def cfg_of(tmp_path, dataset, policy, encoder, extra=()):
    """The tiny training config of ``policy`` with ``encoder``, composed without any attention= given."""
    base = [o for o in tiny_overrides(tmp_path, dataset, policy) if not o.startswith("attention=")]
    return compose(base + ENCODERS[encoder] + list(extra))


def policy_and_batch(cfg, n=4):
    pc = cfg.policy
    data = make_dataset(cfg.task, list(pc.input_shapes))
    ds = SequenceDataset(data, list(pc.input_shapes), n_obs_steps=pc.n_obs_steps, horizon=pc.horizon,
                         n_action_steps=pc.n_action_steps)
    batch = torch.utils.data.default_collate([ds[i] for i in range(n)])
    torch.manual_seed(0)
    return make_policy(pc, compute_stats(data, pc.lowdim_keys + ["action"])), batch


def obs_of(policy, batch):
    return {k: batch[k] for k in policy.config.input_shapes}


# --- the ResNet-18 baseline ---------------------------------------------------------------------
def test_resnet18_is_torchvisions_with_group_norm_and_a_keypoint_read_out_at_any_size():
    torch.manual_seed(0)
    enc = ResNet18(ResNetConfig())
    norms = [m for m in enc.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    assert len(norms) == 20 and all(isinstance(m, nn.GroupNorm) for m in norms)  # ResNet-18's 20 norms, none BatchNorm
    assert all(m.num_groups == m.num_channels // GROUP_NORM_CHANNELS for m in norms)
    assert not any(isinstance(m, (nn.AdaptiveAvgPool2d, nn.Linear)) for m in enc.trunk.modules())  # pool and fc removed
    assert sum(p.numel() for p in enc.trunk.parameters()) == 11_176_512  # torchvision's conv weights + GroupNorm affines
    assert (enc.keypoints.in_features, enc.keypoints.out_features, enc.head.in_features) == (512, 32, 64)
    images = torch.rand(2, 3, 84, 84)
    assert enc.trunk(images).shape == (2, 512, 3, 3)
    assert enc(images).shape == (2, 64) and enc(torch.rand(2, 3, 112, 112)).shape == (2, 64)  # larger renders work


def test_the_keypoint_read_out_is_the_expected_position_of_each_keypoint_map():
    """A feature map that is hot at one place puts every keypoint there, in [-1, 1] (x right, y down)."""
    enc = ResNet18(ResNetConfig(num_keypoints=3))
    with torch.no_grad():
        enc.keypoints.weight.fill_(1.0)
        enc.keypoints.bias.zero_()
    positions = torch.zeros(1, 3 * 5, 512)  # a 3 x 5 map in raster order
    positions[0, 1 * 5 + 4] = 100.0  # row 1 (the middle), column 4 (the right edge)
    assert torch.allclose(enc.spatial_softmax(positions, (3, 5)), torch.tensor([[1.0, 0.0] * 3]), atol=1e-6)


def test_encoder_resnet18_is_one_override_and_names_its_run(tmp_path, tiny_pusht_zarr):
    cfg = cfg_of(tmp_path, tiny_pusht_zarr, "bc", "resnet18")
    assert cfg.policy.encoder == "resnet18" and cfg.attention.kind == "full"
    default = compose(["task=lift", "policy=bc", "encoder=resnet18", "seed=2"])
    assert default.run_dir == "outputs/lift/bc_resnet18_s2"  # not bc_full_s2, the full-attention ViT's
    assert compose(["task=lift", "policy=bc"]).policy.encoder == "vit"


@pytest.mark.parametrize("overrides, message", [
    (["encoder=resnet18", "attention=lookhere"], "encoder=resnet18 has no attention, so attention=lookhere cannot apply"),
    (["policy.encoder=resnet18"], "encoder=resnet18 has no attention, so attention=fibottention cannot apply: pass encoder=resnet18 alone"),
    (["encoder=resnet18", "policy.vit.backbone=timm:vit_tiny_patch16_224"], "encoder=resnet18 replaces the ViT"),
    (["policy.encoder=resnet50"], "policy.encoder='resnet50' is unknown; choose one of vit, resnet18"),
], ids=lambda v: v[-1] if isinstance(v, list) else "")
def test_a_vit_setting_beside_the_resnet_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        compose(["task=lift", "policy=bc", *overrides])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_each_policy_trains_the_resnet_end_to_end_and_acts(tmp_path, tiny_pusht_zarr, policy_name):
    policy, batch = policy_and_batch(cfg_of(tmp_path, tiny_pusht_zarr, policy_name, "resnet18", [f"task.crop_size={RESNET_CROP}"]))
    assert isinstance(policy.obs_encoder.vits[0], ResNet18)
    before = {k: v.clone() for k, v in policy.named_parameters() if k.startswith("obs_encoder.vits")}
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    loss, _ = policy.compute_loss(batch)
    assert torch.isfinite(loss)
    opt.zero_grad()
    loss.backward()
    opt.step()
    unchanged = [k for k, v in policy.named_parameters() if k in before and torch.equal(v, before[k])]
    assert not unchanged, f"the ResNet must be trained end to end: {unchanged[:3]}"
    policy.eval()
    step = {k: v[:, -1] for k, v in obs_of(policy, batch).items()}  # one step of 4 environments
    action = policy.select_action(step)
    assert action.shape == (4, policy.config.action_dim) and torch.isfinite(action).all()


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_a_resnet_checkpoint_loads_to_identical_actions(tmp_path, tiny_pusht_zarr, policy_name):
    cfg = cfg_of(tmp_path, tiny_pusht_zarr, policy_name, "resnet18", [f"task.crop_size={RESNET_CROP}"])
    last = train(cfg).checkpoint
    assert read_checkpoint_meta(last)["policy_config"]["encoder"] == "resnet18"
    a, b = load_policy(last), load_policy(last)
    assert isinstance(a.obs_encoder.vits[0], ResNet18)
    obs = obs_of(a, policy_and_batch(cfg, 2)[1])
    actions = []
    for policy in (a, b):
        torch.manual_seed(3)  # diffusion's noise
        actions.append(policy.predict_action_chunk(obs))
    torch.testing.assert_close(actions[0], actions[1], rtol=0, atol=0)


def test_a_checkpoint_from_before_the_encoder_and_the_new_augmentations_loads_and_resumes(tmp_path, tiny_pusht_zarr):
    cfg = cfg_of(tmp_path, tiny_pusht_zarr, "bc", "vit")
    last = train(cfg).checkpoint
    meta_path = last / "config.json"
    meta = json.loads(meta_path.read_text())
    pc = meta["policy_config"]
    for name in ("encoder", "resnet"):
        del pc[name]
    pc["image_aug"] = {"brightness": 0.0, "contrast": 0.0}  # the fields an older checkpoint has
    meta_path.write_text(json.dumps(meta))
    policy = load_policy(last)
    assert policy.config.encoder == "vit" and policy.config.image_aug == ImageAugConfig()
    assert policy.obs_encoder.augment is None
    assert train(compose([*tiny_overrides(tmp_path, tiny_pusht_zarr, "bc"), "resume=true", "train.steps=3"])).step == 3


# --- augmentation: shift and colour ---------------------------------------------------------------
def captured_inputs(policy, batch, image: torch.Tensor, train_mode: bool) -> torch.Tensor:
    """Every camera frame of the batch set to ``image`` (H, W, C) uint8 -> ``encoder_inputs``."""
    return encoder_inputs(policy, dict(batch, image=image.expand_as(batch["image"]).clone()), train_mode)


def encoder_inputs(policy, batch, train_mode: bool) -> torch.Tensor:
    """What the first camera encoder received in one compute_loss (training) or predict_action_chunk (evaluation)
    of ``batch``, (N, C, H, W)."""
    seen = []
    hook = policy.obs_encoder.vits[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            policy.train(train_mode)
            if train_mode:
                policy.compute_loss(batch)
            else:
                policy.predict_action_chunk(obs_of(policy, batch))
    finally:
        hook.remove()
    return torch.cat(seen)


def source_of(image: torch.Tensor) -> torch.Tensor:
    return image.permute(2, 0, 1).float() / 255.0  # (C, H, W) in [0, 1], as the encoder reads it


def shifts_of(seen: torch.Tensor, source: torch.Tensor) -> list[tuple[int, int] | None]:
    """For each seen image, the (dy, dx) that turns ``source`` into it (its border replicated), or None."""
    padded = F.pad(source[None], (SHIFT,) * 4, mode="replicate")[0]  # (C, H + 2s, W + 2s)
    h, w = source.shape[-2:]
    candidates = {(dy, dx): padded[:, SHIFT + dy : SHIFT + dy + h, SHIFT + dx : SHIFT + dx + w]
                  for dy in range(-SHIFT, SHIFT + 1) for dx in range(-SHIFT, SHIFT + 1)}
    return [next((d for d, c in candidates.items() if torch.equal(img, c)), None) for img in seen]


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_the_shift_moves_each_training_image_on_its_own_and_evaluation_sees_it_unmoved(tmp_path, tiny_pusht_zarr,
                                                                                      policy_name, encoder):
    # the crop is the whole frame, so any movement the encoder sees is the shift's
    cfg = cfg_of(tmp_path, tiny_pusht_zarr, policy_name, encoder,
                 extra=[f"task.crop_size={IMAGE_SIZE}", f"policy.image_aug.shift={SHIFT}"])
    policy, batch = policy_and_batch(cfg)
    image = torch.randint(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    source = source_of(image)
    torch.manual_seed(0)
    shifts = shifts_of(captured_inputs(policy, batch, image, train_mode=True), source)
    assert None not in shifts, "every training image is the frame moved by at most the shift, content kept"
    assert len(set(shifts)) > 1 and set(shifts) != {(0, 0)}, f"a shift of its own per image: {shifts}"
    seen = captured_inputs(policy, batch, image, train_mode=False)
    assert all(torch.equal(img, source) for img in seen), "evaluation applies no shift"


def luma(x: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) -> (N, H, W): torchvision's greyscale weights, which adjust_saturation keeps."""
    return 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]


# what each jitter leaves of a pixel: hue rotates about the grey axis at a kept value (the largest
# channel); saturation blends with the image's greyscale, which it keeps (no clipping in this range)
COLOUR_KEEPS = {"hue": lambda x: x.amax(dim=1), "saturation": luma}


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("jitter, amount", [("hue", 0.3), ("saturation", 0.5)])
def test_hue_and_saturation_change_colour_only_and_in_training_only(tmp_path, tiny_pusht_zarr, encoder, jitter, amount):
    cfg = cfg_of(tmp_path, tiny_pusht_zarr, "bc", encoder,
                 extra=[f"task.crop_size={IMAGE_SIZE}", f"policy.image_aug.{jitter}={amount}"])
    policy, batch = policy_and_batch(cfg)
    # mid-range colours, so no jitter in range is clipped at 0 or 1
    image = torch.randint(100, 156, (IMAGE_SIZE, IMAGE_SIZE, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    source = source_of(image)
    torch.manual_seed(0)
    seen = captured_inputs(policy, batch, image, train_mode=True)
    assert all(not torch.allclose(img, source, atol=1e-3) for img in seen), "every training image is recoloured"
    assert len({round(img.sum().item(), 3) for img in seen}) == len(seen), "with a factor of its own"
    keep = COLOUR_KEEPS[jitter]
    torch.testing.assert_close(keep(seen), keep(source[None]).expand(len(seen), -1, -1), rtol=0, atol=1e-4)
    assert all(torch.equal(img, source) for img in captured_inputs(policy, batch, image, train_mode=False))


@pytest.mark.parametrize("field, value, message", [
    ("hue", 0.5, r"policy.image_aug.hue must be in \[0, 0.5\), got 0.5"),
    ("saturation", -0.1, r"policy.image_aug.saturation must be in \[0, 1\), got -0.1"),
    ("shift", -1, r"policy.image_aug.shift must be >= 0 pixels \(0: no shift\), got -1"),
    ("shift", 76, r"policy.image_aug.shift \(76\) must be smaller than the 76-px crop"),  # Lift's crop
])
def test_an_augmentation_out_of_range_is_refused_in_one_line_at_composition(field, value, message):
    with pytest.raises(ValueError, match=message) as err:
        compose(["task=lift", "policy=bc", "recipe=none", f"policy.image_aug.{field}={value}"])
    assert "\n" not in str(err.value)


def test_the_augmentation_is_off_by_default_and_shifts_before_it_recolours():
    assert ImageAugConfig().transform(84) is None
    steps = ImageAugConfig(shift=SHIFT, hue=0.1, saturation=0.2).transform(84).transforms
    assert [type(t).__name__ for t in steps] == ["RandomCrop", "ColorJitter"]
    crop, jitter = steps
    assert (crop.padding, crop.padding_mode, crop.size) == ([SHIFT] * 4, "edge", (84, 84))
    assert (jitter.brightness, jitter.hue, jitter.saturation) == (None, (-0.1, 0.1), (0.8, 1.2))
