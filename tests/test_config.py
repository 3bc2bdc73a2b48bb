"""The one config tree: every combination of the groups composes and builds its policy; mistakes name the field."""
import itertools

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException

from core.config import CONFIG_DIR, compose
from policies.registry import POLICIES, make_policy
from policies.vision.attention import KINDS

TASKS = sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))
RECIPES = sorted(p.stem for p in (CONFIG_DIR / "recipe").glob("*.yaml"))


def test_the_groups_hold_what_the_package_offers():
    assert TASKS == ["can", "lift", "pusht"]
    assert RECIPES == ["cpu", "none", "paper"]


def _settings(path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#"))


def test_no_two_recipe_files_say_the_same_thing():
    files = sorted((CONFIG_DIR / "recipe").rglob("*.yaml"))
    settings = [_settings(p) for p in files]
    same = [(a.name, b.name) for (a, x), (b, y) in itertools.combinations(zip(files, settings), 2) if x == y]
    assert len(files) > 10 and not same, same


def _recipe_report(overrides: list[str]) -> list[str]:
    from core.config import compose_dict, recipe_report

    composed = compose_dict("config", overrides, with_hydra=True)
    choices = dict(composed.hydra.runtime.choices)
    return recipe_report(choices, list(composed.hydra.overrides.task), compose("config", overrides).task)


def test_training_says_which_recipe_pieces_applied_and_what_they_changed_in_the_task():
    assert _recipe_report(["task=lift", "policy=bc", "attention=full"]) == [
        "recipe pieces: recipe/cpu, recipe/pair/cpu/lift_bc, recipe/task/cpu/lift",
        "recipe changed task.crop_size: 76 -> 84",
        "recipe changed task.input_shapes.robot0_eye_in_hand_image: [3, 84, 84] -> None",
    ]
    # what the command line sets is the user's, not the recipe's; recipe=none changes nothing
    assert _recipe_report(["task=lift", "policy=bc", "attention=full", "task.crop_size=60"]) == [
        "recipe pieces: recipe/cpu, recipe/pair/cpu/lift_bc, recipe/task/cpu/lift",
        "recipe changed task.input_shapes.robot0_eye_in_hand_image: [3, 84, 84] -> None",
    ]
    assert _recipe_report(["task=lift", "policy=bc", "recipe=none"]) == ["recipe pieces: recipe/none"]


@pytest.mark.parametrize("task", TASKS)
def test_the_cpu_recipe_composes_without_a_warning(task, recwarn):
    for policy, attention in itertools.product(sorted(POLICIES), KINDS):
        compose("config", [f"task={task}", f"policy={policy}", f"attention={attention}", "recipe=cpu"])
    assert not [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("task", TASKS)
def test_every_combination_composes_and_builds_its_policy(task, recipe):
    for policy, attention in itertools.product(sorted(POLICIES), KINDS):
        cfg = compose("config", [f"task={task}", f"policy={policy}", f"attention={attention}", f"recipe={recipe}"])
        pc = cfg.policy
        assert pc.name == policy and pc.vit.attention == cfg.attention and pc.vit.attention.kind == attention
        assert pc.input_shapes == cfg.task.input_shapes and pc.action_dim == cfg.task.action_dim
        assert cfg.run_dir == f"outputs/{task}/{policy}_{attention}_s0"
        stats = {k: {"min": -np.ones(pc.input_shapes[k][0], np.float32), "max": np.ones(pc.input_shapes[k][0], np.float32)}
                 for k in pc.lowdim_keys}
        stats["action"] = {"min": -np.ones(pc.action_dim, np.float32), "max": np.ones(pc.action_dim, np.float32)}
        # every constructor runs; the weights are left unallocated (the papers' recipe is ~250M parameters a
        # policy, seconds to initialise each: the tests that train build real ones)
        with torch.device("meta"):
            built = make_policy(pc, stats)
        assert type(built) is POLICIES[policy]
        assert len(built.obs_encoder.vits) == (1 if pc.share_vit else len(pc.image_keys))


@pytest.mark.parametrize("override, message", [
    ("train.stepz=3", "Could not override 'train.stepz'"),  # an unknown key
    ("train.steps=abc", "train.steps=abc"),  # a wrong type
    ("policy.vit.dimm=3", "Could not override 'policy.vit.dimm'"),
])
def test_unknown_keys_and_wrong_types_are_refused_at_composition(override, message):
    with pytest.raises(ConfigCompositionException, match=message):
        compose("config", [override])
    with pytest.raises(MissingConfigException, match="attention/sparse-magic"):
        compose("config", ["attention=sparse-magic"])


@pytest.mark.parametrize("overrides, message", [
    ("train.checkpoint_every=0", "train.checkpoint_every must be >= 1, got 0"),
    ("train.steps=0", "train.steps must be >= 1, got 0"),
    ("train.precision=fp8", "train.precision='fp8' is unknown"),
    ("policy.vit.patch_size=100", r"task.crop_size \(84\) is smaller than one 100-px patch"),
    ("eval.workers=-1", "workers must be >= 0, got -1"),
    ("device=tpu", "device='tpu' is unknown"),
    ("policy.horizon=4 policy.n_action_steps=8", r"policy.horizon \(4\) must cover"),
    ("policy.n_image_obs_steps=3", r"policy.n_image_obs_steps \(3\) must be between 1 and n_obs_steps \(2\)"),
    ("attention.kind=nope", "attention.kind='nope' is unknown; known kinds: full, fibottention"),
    ("attention.impl=fast", "attention.impl='fast' is unknown"),
    ("attention=lookhere attention.variant=60", "attention.variant"),
    ("policy.vit.dim=50 policy.vit.num_heads=4", r"vit.dim \(50\) must be divisible by vit.num_heads \(4\)"),
    ("policy=bc policy.head=x", r"policy.head='x' is unknown; choose one of \('mlp', 'gmm'\)"),
    ("policy=bc policy.loss=huber", r"policy.loss='huber' is unknown"),
    ("policy=bc policy.gmm.std_activation=relu", r"policy.gmm.std_activation='relu' is unknown"),
    ("policy=bc policy.gmm_over=episode", r"policy.gmm_over='episode' is unknown"),
    ("policy=bc_rnn policy.gmm.num_modes=0", r"policy.gmm.num_modes must be >= 1"),
    ("policy=bc policy.gmm.min_std=0.0", r"policy.gmm.min_std must be > 0"),
    ("policy=bc policy.dropout=1.0", r"policy.dropout \(1.0\) must be in \[0, 1\)"),
    ("policy=bc policy.hidden_dims=[64,0]", r"policy.hidden_dims \[64, 0\] must all be >= 1"),
])
def test_config_errors_name_the_field(overrides, message):
    """Every value that can never work is refused at composition, naming its field (one test for all)."""
    with pytest.raises(ValueError, match=message):
        compose("config", ["recipe=none", *overrides.split()])


def test_an_image_size_that_drops_pixels_says_so_unless_chosen(recwarn):
    with pytest.warns(UserWarning, match="task.crop_size 84 is not a multiple of the 10-px patch: the last 4 pixel"):
        compose("config", ["recipe=none", "policy.vit.patch_size=10"])
    recwarn.clear()
    compose("config", ["recipe=none", "policy.vit.patch_size=10", "policy.drop_crop_remainder=true"])
    assert not [w for w in recwarn if "crop_size" in str(w.message)]


def test_rollout_and_generate_parse_like_training():
    r = compose("rollout", ["checkpoint=some/run", "num_episodes=5", "image_size=112"])
    assert (r.checkpoint, r.num_episodes, r.image_size, r.seed, r.workers) == ("some/run", 5, 112, 100000, 0)
    g = compose("generate", ["task=lift", "num_episodes=3"])
    assert (g.task.name, g.num_episodes, g.out) == ("lift", 3, "data/lift/ph_image.hdf5")  # out: the path training reads
    with pytest.raises(ConfigCompositionException, match="Could not override 'episodes'"):
        compose("rollout", ["checkpoint=x", "episodes=3"])
    with pytest.raises(ValueError, match="num_episodes must be >= 1"):
        compose("generate", ["task=pusht", "num_episodes=0"])


def test_the_photometric_augmentation_preset_is_what_the_augmentation_rows_trained():
    from studies.catalog import VARIANTS
    from studies.records import PAPERS_SETTING

    AUGMENT = VARIANTS["augment"].overrides

    base = ["task=lift", "policy=bc", "attention=fibottention"]
    default = compose("config", base)  # recipe=cpu, which includes the preset since the augmentation rows
    assert default == compose("config", [*base, "recipe=cpu", *(f"{k}={v}" for k, v in AUGMENT.items())])
    assert (default.policy.image_aug.brightness, default.policy.image_aug.contrast) == (0.3, 0.5)
    papers = compose("config", [*base, *(f"{k}={v}" for k, v in PAPERS_SETTING.items())])  # what every study cell trains
    assert (papers.policy.image_aug.brightness, papers.policy.image_aug.contrast) == (0.0, 0.0)
    assert compose("config", [*base, "recipe=paper"]).policy.image_aug.brightness == 0.0
    assert compose("config", [*base, "recipe=paper", "+recipe/preset@_global_=photometric_aug"]).policy.image_aug.contrast == 0.5
