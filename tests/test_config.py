"""The one config tree: every combination of the groups composes and builds its policy; mistakes name the field."""
import itertools

import numpy as np
import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from core.config import CONFIG_DIR, compose
from policies.base import POLICIES, load_builtin_policies, make_policy
from policies.vision.attention import KINDS

load_builtin_policies()
TASKS = sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))
RECIPES = sorted(p.stem for p in (CONFIG_DIR / "recipe").glob("*.yaml"))


def test_the_groups_hold_what_the_package_offers():
    assert TASKS == ["can", "lift", "pusht"]
    assert RECIPES == ["cpu", "none", "paper"]
    # every measured recipe covers every task and policy (a missing file would silently mean "no recipe")
    for recipe, task, policy in itertools.product(("cpu", "paper"), TASKS, POLICIES):
        assert (CONFIG_DIR / "recipe" / "by_policy" / recipe / f"{task}_{policy}.yaml").is_file(), (recipe, task, policy)


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


@pytest.mark.parametrize("override, message", [
    ("train.checkpoint_every=0", "train.checkpoint_every must be >= 1, got 0"),
    ("train.steps=0", "train.steps must be >= 1, got 0"),
    ("train.precision=fp8", "train.precision='fp8' is unknown"),
    ("policy.vit.patch_size=100", r"task.crop_size \(84\) is smaller than one 100-px patch"),
    ("eval.workers=-1", "workers must be >= 0, got -1"),
    ("device=tpu", "device='tpu' is unknown"),
])
def test_values_that_can_never_work_are_refused_with_the_field(override, message):
    with pytest.raises(ValueError, match=message):
        compose("config", ["recipe=none", override])


def test_an_image_size_that_drops_pixels_says_so():
    with pytest.warns(UserWarning, match="task.crop_size 84 is not a multiple of the 10-px patch: the last 4 pixel"):
        compose("config", ["recipe=none", "policy.vit.patch_size=10"])


def test_rollout_and_generate_parse_like_training():
    r = compose("rollout", ["checkpoint=some/run", "num_episodes=5", "image_size=112"])
    assert (r.checkpoint, r.num_episodes, r.image_size, r.seed, r.workers) == ("some/run", 5, 112, 100000, 0)
    g = compose("generate", ["task=lift", "num_episodes=3"])
    assert (g.task.name, g.num_episodes, g.out) == ("lift", 3, "data/lift/ph_image.hdf5")  # out: the path training reads
    with pytest.raises(ConfigCompositionException, match="Could not override 'episodes'"):
        compose("rollout", ["checkpoint=x", "episodes=3"])
    with pytest.raises(ValueError, match="num_episodes must be >= 1"):
        compose("generate", ["task=pusht", "num_episodes=0"])
