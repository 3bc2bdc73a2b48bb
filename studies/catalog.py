"""The studies, as data, each arm, variant and setting defined once: what each study trains (``python train_policy.py``)
and evaluates (``python rollout.py``), and what ``python -m studies.claims`` compares: the papers' claims as rows naming
(study, arm, setting, variant) by id, the training fixes, the recipes and the README's rows. A new study, claim or
condition is one more entry.
"""
from __future__ import annotations

from dataclasses import dataclass

from envs.shifts import COMPARED_SEVERITY, PAPERS_PIXEL, RECIPE_PIXEL, SCENE_SEVERITIES as EVERY_SEVERITY, Shift, scene_set
from studies.study import PAPERS, Arm, Setting, Study, Variant

# training overrides the studies vary (the command line's form; records are compared in a canonical form,
# studies.records.canonical, so "+key" and "~key" there match "key" and "key=null" here)
VARIANTS = {v.id: v for v in [
    PAPERS,
    # recipe=cpu's jitter (torchvision ColorJitter per image), which the papers'-setting cells turn off
    Variant("augment", "photometric augmentation", {"policy.image_aug.brightness": "0.3", "policy.image_aug.contrast": "0.5"},
            note="recipe=cpu's jitter"),
    Variant("per-image", "per-image input", {"policy.vit.input_norm": "per_image"}),
    # training that survives the scene: DrQ's 4 px random shift on 84-px images; hue and saturation jitter;
    # demonstrations rendered under randomised scenes (generate_demos.py task=lift out=data/lift/ph_image_scene.hdf5
    # scene_randomization=all: severities up to envs.shifts.TRAINING_RANGE = 2, so severity 3 lies outside the training range)
    Variant("shift", "random shift", {"policy.image_aug.shift": "4"}),
    Variant("colour", "hue/saturation jitter", {"policy.image_aug.hue": "0.1", "policy.image_aug.saturation": "0.5"}),
    Variant("randomised", "randomised-scene demonstrations", {"task.dataset.path": "data/lift/ph_image_scene.hdf5"}),
    # the wrist camera beside agentview (robomimic's image observations): a view that a moved agentview does not move
    Variant("wrist", "wrist camera", {"task.input_shapes.robot0_eye_in_hand_image": "[3,84,84]"}),
    # the blind floor: no camera (recipe=cpu already drops Lift's wrist camera), what every camera variant must beat under
    # a shift (it never sees a frame, so one clean floor holds under every visual shift)
    Variant("no-camera", "no camera", {"task.input_shapes.agentview_image": "null"}),
    # for a moved camera: with the random shift, an affine warp on half the images (camera 1-2's turn, zoom and move);
    # demonstrations under drawn camera poses over severities 1-3 (generate_demos.py task=lift scene_randomization=camera
    # scene_randomization_max=3 out=data/lift/ph_image_camera3.hdf5); with them, each frame's pose as a ray map (the
    # policy told where its camera is)
    Variant("affine", "affine warp", {"policy.image_aug.rotate": "3", "policy.image_aug.scale": "0.06", "policy.image_aug.geometric_p": "0.5"}),
    Variant("camera-demos", "camera-randomised demonstrations", {"task.dataset.path": "data/lift/ph_image_camera3.hdf5"}),
    Variant("ray-maps", "ray maps", {"+task.input_shapes.agentview_camera": "[13]", "policy.ray_maps": "true"}),
    Variant("diffusion", "diffusion", {"policy.down_dims": "[32,64,128]", "policy.prediction_type": "sample"}),  # before policy/cpu/diffusion
    *(Variant(f"{n}-demos", f"{n} demonstrations", {"train.steps": "2000", "train.max_episodes": str(n)}) for n in (10, 25, 50)),
]}

# each task's blind floor: every camera its recipe=cpu reads, deleted (Lift's recipe already drops the wrist camera;
# Can's data without frames: generate_demos.py task=can cameras=[] out=data/can/ph_lowdim.hdf5)
NO_CAMERA = {"lift": VARIANTS["no-camera"].overrides,
             "can": {"task.input_shapes.agentview_image": "null", "task.input_shapes.robot0_eye_in_hand_image": "null"},
             "pusht": {"task.input_shapes.image": "null"}}

ARMS = {a.id: a for a in [
    Arm("full", "full", {"attention": "full"}),
    Arm("fibottention", "Fibottention", {"attention": "fibottention"}),
    Arm("lookhere", "LookHere-90", {"attention": "lookhere"}),
    # the Fibottention authors' two settings, and the sparse baseline of their paper
    Arm("fibottention:windows=robot", "Fibottention (robot windows) †", {"attention": "fibottention", "attention.windows": "robot"}, True),
    Arm("fibottention:mask_mode=multiplicative", "Fibottention (multiplicative mask) †",
        {"attention": "fibottention", "attention.mask_mode": "multiplicative"}, True),
    Arm("bigbird", "BigBird", {"attention": "bigbird"}),
    # the field's default encoder (configs/encoder/resnet18.yaml): no attention, so its runs record attention=full
    Arm("resnet18", "ResNet-18", {"attention": "full", "policy.encoder": "resnet18"}),
    # LookHere as its paper reads it out (agentview only, CLS, 8-px patches), and recipe=cpu's LookHere on diffusion
    Arm("lookhere:plain", "plain LookHere-90", {"attention": "lookhere", "attention.global_slope": "1.0", "attention.rotate_directions":
        "false", "policy.vit.patch_size": "8", "policy.vit.pool": "cls", "task.input_shapes.robot0_eye_in_hand_image": "null"}),
    Arm("lookhere:cpu", "LookHere-90", {"attention": "lookhere", "attention.global_slope": "0.25", "attention.rotate_directions": "true",
        "policy.vit.patch_size": "12", "policy.vit.pool": "spatial_softmax", **VARIANTS["wrist"].overrides}),
]}
ENCODERS, AUTHORS = ("full", "fibottention", "lookhere"), ("fibottention:windows=robot", "fibottention:mask_mode=multiplicative", "bigbird")


def variant(vid: str) -> Variant:
    """A variant by id; ``a+b`` is both, in that order."""
    parts = [VARIANTS[p] for p in vid.split("+")]
    return parts[0] if len(parts) == 1 else Variant(vid, " + ".join(p.label for p in parts), {k: v for p in parts for k, v in p.overrides.items()},
                                                    " + ".join(p.note or p.label for p in parts))


def arms(*ids: str) -> tuple[Arm, ...]:
    return tuple(ARMS[i] for i in ids)


def variants(*ids: str) -> tuple[Variant, ...]:
    return tuple(map(variant, ids))


CLEAN = Setting("clean", "clean")


def shifted(shifts) -> tuple[Setting, ...]:
    return tuple(Setting(s.tag, s.label, {"corruption": [list(s)]}) for s in shifts)


def scene(task: str, severities=(COMPARED_SEVERITY,)) -> tuple[Setting, ...]:
    """The scene shifts ``task`` renders (PushT has no light), at severity 2 (the level the claims compare) unless given."""
    return shifted(scene_set(task, severities))


PAPERS_SHIFTS, PIXEL = shifted(PAPERS_PIXEL), shifted(RECIPE_PIXEL)  # the papers' two corruptions; the recipes' four
LARGER = tuple(Setting(f"{n}px", f"rendered at {n} px", {"image_size": n}) for n in (112, 128))
# LookHere's global slope scaled by the training size over the rendered one, as the paper does
SLOPE_SCALED = tuple(Setting(f"{n}px_slope", f"rendered at {n} px, s_g scaled", {"image_size": n, "attention": {"global_slope": 84 / n}},
                             only="lookhere") for n in (112, 128))
DIVERSITY = Setting("diversity", "1 − mean pairwise CKA of the heads' outputs")  # probes.diversity's records, no rollout
LIFT_CAP = 200  # Lift's shifted episodes: no success in 110 such episodes took 80 steps (Can and PushT's take longer: their horizon)

STUDIES = {s.name: s for s in [
    Study("main", ("lift",), ("bc",), arms(*ENCODERS, *AUTHORS), (CLEAN,)),
    Study("data_efficiency", ("lift",), ("bc",), arms(*ENCODERS), (CLEAN,), variants("10-demos", "25-demos", "50-demos")),
    Study("robustness", ("lift",), ("bc",), arms(*ENCODERS, *AUTHORS), (CLEAN, *PAPERS_SHIFTS, *scene("lift")), cap=LIFT_CAP),
    # the papers' other two tasks, each with the policy of its measured CPU recipe (README "Recipes")
    Study("can", ("can",), ("bc",), arms(*ENCODERS), (CLEAN, *PAPERS_SHIFTS)),
    # PushT's recipe is the papers' setting (its recipe dropped the jitter), so its study holds the recipe's shifts too
    Study("pusht", ("pusht",), ("diffusion",), arms(*ENCODERS), (CLEAN, *PIXEL, *scene("pusht"))),
    # the recommended recipe where it is recommended: Can BC and PushT diffusion with recipe=cpu's jitter; on PushT full
    # attention's three seeds showed the jitter's clean cost (the recipe dropped it there), so no other encoder has it
    *(Study(f"{task}_recipe", (task,), (policy,), arms(*ids), (CLEAN, *PIXEL, *scene(task)), variants("augment"))
      for task, policy, ids in (("can", "bc", ENCODERS), ("pusht", "diffusion", ("full",)))),
    # training that survives the scene, on top of recipe=cpu's jitter; hue/saturation alone since the shift made every
    # policy stop looking (probes.vision_reliance); a second view that a moved agentview leaves where it was
    Study("scene_training", ("lift",), ("bc",), arms("full", "fibottention"), (CLEAN, *scene("lift", EVERY_SEVERITY), *PIXEL),
          variants("augment", "augment+shift", "augment+shift+colour", "augment+randomised", "augment+randomised+shift+colour",
                   "augment+colour", "augment+wrist"), cap=LIFT_CAP),
    # the variant that kept Lift's clean success (hue/saturation) on the other two tasks, on top of each task's recipe
    *(Study(f"{task}_scene_training", (task,), (policy,), arms("full", "fibottention"), (CLEAN, *scene(task, EVERY_SEVERITY), *PIXEL),
            variants(v)) for task, policy, v in (("can", "bc", "augment+colour"), ("pusht", "diffusion", "colour"))),
    # the field's default encoder beside the three ViTs, in the papers' setting and with the jitter (the ViT cells are
    # robustness's and scene_training's run directories: same overrides)
    Study("encoders", ("lift",), ("bc",), arms("resnet18", *ENCODERS), (CLEAN, *PIXEL, *scene("lift")), variants("papers", "augment"),
          cap=LIFT_CAP, shares=("robustness", "scene_training")),
    Study("resolution", ("lift",), ("bc",), arms(*ENCODERS), (CLEAN, *LARGER, *SLOPE_SCALED), cap=LIFT_CAP),
    # a moved camera (Lift BC on recipe=cpu): the blind floor, then each camera variant under every camera severity
    Study("camera", ("lift",), ("bc",), arms("full", "fibottention"), (CLEAN, *shifted(Shift("camera", s) for s in EVERY_SEVERITY)),
          variants("augment+no-camera", "augment+shift+affine", "augment+camera-demos", "augment+camera-demos+ray-maps"), cap=LIFT_CAP),
]}
SETTINGS = {s.id: s for s in (*(s for study in STUDIES.values() for s in study.settings), DIVERSITY)}


@dataclass(frozen=True)
class Claim:
    """A claim row: ``arm`` against ``baseline`` (arm ids), both trained with ``variant``, under ``setting``, in ``study``."""
    claim: str
    study: str
    task: str
    policy: str
    arm: str
    setting: str
    variant: str = "papers"
    baseline: str = "full"
    measure: str = "success"
    sign: int = 1  # the side of 0 the paper claims
    side_only: bool = False  # a baseline method that claims nothing: its verdict names the side of full attention


def grid(claim: str, places, arm_ids, setting_ids, variant_id="papers", **kw) -> list[Claim]:
    """One row per (study, task, policy) x arm x setting, in that order."""
    return [Claim(claim, *place, a, s, variant_id, **kw) for place in places for a in arm_ids for s in setting_ids]


ids = lambda settings: [s.id for s in settings]
LIFT = ("lift", "bc")
MAIN, EFFICIENCY, ROBUSTNESS, ENCODER_STUDY = (("main", *LIFT), ("data_efficiency", *LIFT), ("robustness", *LIFT), ("encoders", *LIFT))
OTHER_TASKS = [("can", "can", "bc"), ("pusht", "pusht", "diffusion")]  # each task's own study, its CPU recipe's policy
# where each task's recommended recipe lives: Lift and Can train with recipe=cpu's jitter (cells of robustness and can_recipe);
# PushT's recipe dropped it (-12 points clean, full attention, three seeds), so its papers'-setting study is its recipe
JITTERED_RECIPES, PUSHT = [ROBUSTNESS, ("can_recipe", "can", "bc")], OTHER_TASKS[1]
TASKS = ("lift", "can", "pusht")
SUCCESS, ROBUST, DIVERSE, SCENE_ROBUST = "Better task success", "More robust to corruptions", "More diverse heads", "More robust to scene shifts"
BASELINE = ": sparse baseline (BigBird; no claim)"
PAPERS_IDS, PIXEL_IDS, EVERY_SHIFT = ids(PAPERS_SHIFTS), ids(PIXEL), ["clean", *ids(PIXEL), *ids(scene("lift"))]

CLAIMS = [
    *grid(f"{SUCCESS} (Fibottention)", [MAIN], ["fibottention", AUTHORS[0]], ["clean"]),
    *grid(f"{SUCCESS} (Fibottention)", OTHER_TASKS, ["fibottention"], ["clean"]),
    # each claim again under the recommended recipe (recipe=cpu's jitter), where a user trains (Lift's cells: robustness's)
    *grid(f"{SUCCESS} (Fibottention)", JITTERED_RECIPES, ["fibottention"], ["clean"], "augment"),
    *grid(f"{SUCCESS} (LookHere)", [MAIN, *OTHER_TASKS], ["lookhere"], ["clean"]),
    *grid(f"{SUCCESS} (LookHere)", JITTERED_RECIPES, ["lookhere"], ["clean"], "augment"),
    *grid(SUCCESS + BASELINE, [MAIN], ["bigbird"], ["clean"], side_only=True),
    *(row for n in ("10", "25", "50") for row in grid("Better with scarce data (Fibottention)", [EFFICIENCY], ["fibottention"], ["clean"], f"{n}-demos")),
    *(row for n in ("10", "25", "50") for row in grid("Better with scarce data (LookHere)", [EFFICIENCY], ["lookhere"], ["clean"], f"{n}-demos")),
    *grid(f"{ROBUST} (Fibottention)", [ROBUSTNESS], ["fibottention", *AUTHORS[:2]], PAPERS_IDS),
    *grid(f"{ROBUST} (Fibottention)", OTHER_TASKS, ["fibottention"], PAPERS_IDS),
    *grid(f"{ROBUST} (Fibottention)", JITTERED_RECIPES, ["fibottention"], PIXEL_IDS, "augment"),
    *grid(f"{ROBUST} (Fibottention)", [PUSHT], ["fibottention"], PIXEL_IDS[len(PAPERS_IDS):]),  # PushT's recipe: the papers' setting
    *grid(f"{ROBUST} (LookHere)", [ROBUSTNESS, *OTHER_TASKS], ["lookhere"], PAPERS_IDS),
    *grid(f"{ROBUST} (LookHere)", JITTERED_RECIPES, ["lookhere"], PIXEL_IDS, "augment"),
    *grid(f"{ROBUST} (LookHere)", [PUSHT], ["lookhere"], PIXEL_IDS[len(PAPERS_IDS):]),
    *grid(ROBUST + BASELINE, [ROBUSTNESS], ["bigbird"], PAPERS_IDS, side_only=True),
    # with the jitter on Lift: Fibottention's cells are scene_training's, LookHere's the encoders study's
    *(row for a, name, jittered in (("fibottention", "Fibottention", "scene_training"), ("lookhere", "LookHere", "encoders")) for row in [
        *grid(f"{SCENE_ROBUST} ({name})", [ROBUSTNESS], [a], ids(scene("lift"))),
        *grid(f"{SCENE_ROBUST} ({name})", [(jittered, *LIFT)], [a], ids(scene("lift")), "augment"),
        *grid(f"{SCENE_ROBUST} ({name})", [JITTERED_RECIPES[1]], [a], ids(scene("can")), "augment"),
        *grid(f"{SCENE_ROBUST} ({name})", [PUSHT], [a], ids(scene("pusht")))]),
    *(row for v in ("papers", "augment") for row in grid("The field's default encoder (ResNet-18; no claim)", [ENCODER_STUDY],
                                                          ["resnet18"], EVERY_SHIFT, v, side_only=True)),
    *grid("Extrapolates to larger images (LookHere)", [("resolution", *LIFT)], ["lookhere"], ids(LARGER + SLOPE_SCALED)),
    *grid(f"{DIVERSE} (Fibottention)", [("diversity", *LIFT)], ["fibottention", *AUTHORS[:2]], ["diversity"], measure="head_diversity"),
    *grid(f"{DIVERSE} (LookHere)", [("diversity", *LIFT)], ["lookhere"], ["diversity"], measure="head_diversity"),
    *grid("The gain needs the sparsity (Fibottention)", [MAIN], ["fibottention"], ["clean"], baseline=AUTHORS[1]),
]

VERDICT_SEEDS = 3  # training seeds per side that a verdict needs (one checkpoint swings by about ±10 points)
COLLAPSE = 0.5  # a seed "collapses" under a corruption below this success rate (full attention keeps about 0.9)
LOTTERY = [(*ROBUSTNESS, a, s) for a in ("full", "fibottention", "lookhere", "bigbird") for s in PAPERS_IDS]


@dataclass(frozen=True)
class Fix:
    """A training-side fix (a variant id) per encoder and condition, against its ``base`` variant: claims.md's tables."""
    variant: str
    encoders: tuple[str, ...]
    study: str = "robustness"  # whose records hold the fixed cells
    base: str = "papers"  # the training both sides share, the fix added on top (e.g. recipe=cpu's jitter)
    base_study: str = ""  # whose records hold the base cells (default: ``study``)


SCENE_FIX = {"study": "scene_training", "base": "augment"}
FIXES = {"per-image": Fix("per-image", ("full", "fibottention")), "augment": Fix("augment", ENCODERS),
         **{name: Fix(name.replace("-", "+"), ("full", "fibottention"), **SCENE_FIX)
            for name in ("shift", "shift-colour", "randomised", "colour", "wrist", "randomised-shift-colour")},
         # the recipe's jitter on Can and PushT, against each task's papers'-setting cells
         "augment-can": Fix("augment", ENCODERS, "can_recipe", base_study="can"),
         "augment-pusht": Fix("augment", ("full",), "pusht_recipe", base_study="pusht"),
         # hue/saturation on the other two tasks, against each task's recipe: Can's jitter, PushT's papers' setting
         "colour-can": Fix("colour", ("full", "fibottention"), "can_scene_training", "augment", "can_recipe"),
         "colour-pusht": Fix("colour", ("full", "fibottention"), "pusht_scene_training", base_study="pusht")}
# training for a moved camera (study camera), each against recipe=cpu's own cells (scene_training's jitter variant)
CAMERA_FIX = {"study": "camera", "base": "augment", "base_study": "scene_training"}
CAMERA_FIXES = {"camera-affine": "shift+affine", "camera-demos": "camera-demos", "camera-ray-maps": "camera-demos+ray-maps"}
FIXES |= {name: Fix(vid, ("full", "fibottention"), **CAMERA_FIX) for name, vid in CAMERA_FIXES.items()}
# the camera's adoption rule, on top of the clean margin: the least mean success per camera setting (the settings that a
# lab's bumped camera reaches: camera 2 on every task, camera 3 on Lift, where the recipe already holds camera 1)
CAMERA_RULE = {"lift": {"camera2": 0.90, "camera3": 0.75}, "can": {"camera2": 0.70}, "pusht": {"camera2": 0.40}}
# the rule for adopting a training fix into a task's recipe, on the means over seeds: clean success within
# ADOPT_CLEAN_MARGIN of the same encoder's recipe, and at least ADOPT_SHIFT_FLOOR under every scene shift the task
# renders at severity 2 (inside the training range of randomised demonstrations), each on VERDICT_SEEDS seeds
ADOPT_CLEAN_MARGIN, ADOPT_SHIFT_FLOOR = 0.02, 0.90
SCENE_FIXES = ("shift", "shift-colour", "randomised", "colour", "wrist", "randomised-shift-colour", "colour-can", "colour-pusht")
# the README's evidence table: (label, arm id, variant id, the study of its clean row); its shifted rows are robustness's
README_ROWS = [
    ("full attention", "full", "papers", "main"), ("Fibottention", "fibottention", "papers", "main"),
    ("Fibottention, the authors' robot windows (`attention.windows=robot`)", AUTHORS[0], "papers", "main"),
    ("Fibottention, the public code's multiplicative mask (`attention.mask_mode=multiplicative`)", AUTHORS[1], "papers", "main"),
    ("LookHere-90 (the recipe: + wrist camera, 12-px patches, keypoint read-out, rotated directions)", "lookhere", "papers", "main"),
    ("plain LookHere-90 (agentview, CLS read-out, 8-px patches)", "lookhere:plain", "papers", "main"),
    ("BigBird (band ±3, CLS, 3 random keys per row; the Fibottention paper's sparse baseline)", "bigbird", "papers", "main"),
    ("Fibottention, per-image input normalisation (`policy.vit.input_norm=per_image`)", "fibottention", "per-image", "robustness"),
    ("full attention, per-image input normalisation", "full", "per-image", "robustness"),
    ("Fibottention, photometric augmentation (`recipe=cpu`'s jitter)", "fibottention", "augment", "robustness"),
    ("full attention, photometric augmentation", "full", "augment", "robustness"),
    ("LookHere-90 (the recipe's), photometric augmentation", "lookhere", "augment", "robustness")]
README_SETTINGS = ("clean", *PAPERS_IDS)


@dataclass(frozen=True)
class Recipe:
    """A row of the README's recipe table: a task and policy as ``recipe=cpu`` trains them, and the cells that measured it."""
    task: str
    policy: str
    label: str  # the policy column's text
    pieces: str  # what the recipe sets, and in which files under configs/recipe/
    studies: tuple[str, ...]  # whose records hold its cells (pooled, a cell counted once)
    arms: tuple[str, ...]  # its encoders (arm ids), in the column's order
    variant: str = "augment"
    pick: bool = False  # a row of "Which to pick": the recommended recipe of its task, measured under the shifts


RECIPES = [
    Recipe("lift", "bc", "bc", "agentview camera uncropped (`task/cpu/lift`), 4000 steps (`pair/cpu/lift_bc`); LookHere adds the wrist "
           "camera, 12-px patches, keypoints, rotated directions, slope 0.25 (`attention/cpu/lift_bc_lookhere`)",
           ("robustness", "scene_training", "encoders"), ENCODERS, pick=True),
    Recipe("lift", "bc", "bc, `encoder=resnet18`", "as Lift BC, ResNet-18 in place of the ViT (`configs/encoder/resnet18.yaml`)",
           ("encoders",), ("resnet18",)),
    Recipe("lift", "diffusion", "diffusion", "as BC, x0 prediction, U-Net 32-64-128 (`policy/cpu/diffusion`), 5000 steps "
           "(`pair/cpu/lift_diffusion`, `attention/cpu/lift_diffusion_lookhere`)", ("main",), ("full", "fibottention", "lookhere:cpu"),
           "diffusion"),
    Recipe("can", "bc", "bc", "both cameras uncropped, 12-px patches, keypoints, 15000 steps (`task/cpu/can`, `preset/keypoint_vit`)",
           ("can_recipe",), ENCODERS, pick=True),
    Recipe("pusht", "diffusion", "diffusion", "1000 demonstrations, whole 96-px frame, 12-px patches, x0, U-Net 32-64-128, keypoints, "
           "15000 steps, no jitter (`task/cpu/pusht`, `policy/cpu/diffusion`)", ("pusht",), ENCODERS, "papers", pick=True),
    Recipe("pusht", "bc", "bc", "PushT diffusion's observation settings (`task/cpu/pusht`); no working recipe yet", ("main",),
           ("fibottention",), "papers"),
    Recipe("lift", "bc_rnn", "bc_rnn", "Lift BC's observation settings, two steps of low-dim history, LSTM 2×400, GMM 5 modes, "
           "sequences of 10, batch 16, 3000 steps (`policy/cpu/bc_rnn`, `pair/cpu/lift_bc_rnn`)", ("main",), ("fibottention",), "papers"),
    Recipe("can, pusht", "bc_rnn", "bc_rnn (and Can diffusion)", "the matching BC observation settings (`task/cpu/can`, "
           "`task/cpu/pusht`, `policy/cpu/bc_rnn`, `policy/cpu/diffusion`)", (), ("fibottention",), "papers"),
]
