"""The claims of the two papers as rows of data, and the other tables' rows: what ``python -m studies.claims`` measures.

A ``Claim`` row names the paper's claim, the study whose records hold it, the task, the arm, the condition and
the baseline arm (full attention unless named), and the measure (success, coverage or head diversity). A new
claim, task or condition is one more row (``grid`` writes the product of tasks x arms x settings). The table
keeps the order written here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from envs.shifts import COMPARED_SEVERITY, PAPERS_PIXEL, RECIPE_PIXEL, SCENE_KINDS, Shift, scene_kinds_of
from studies.catalog import AUGMENT, COLOUR, NO_CAMERA as NO_CAMERA_OVERRIDES, PER_IMAGE, RANDOMISED, SHIFT, WRIST


@dataclass(frozen=True)
class Arm:
    label: str = field(compare=False)  # how the tables name it
    attention: str
    overrides: dict = field(default_factory=dict)  # training overrides beyond the recipe's papers' setting (records' form)
    authors: bool = False  # †: a setting of the authors' code; a task's verdict leaves it out


@dataclass(frozen=True)
class Setting:
    where: str  # how the measurement column names it
    condition: dict = field(default_factory=dict)  # inference options (records' form)
    overrides: dict = field(default_factory=dict)  # training overrides both arms share (e.g. fewer demonstrations)


FULL = Arm("full", "full")
# the blind floor's overrides as records hold them: a camera the recipe keeps, deleted (studies.measure.floors)
NO_CAMERA = {task: {f"~{key}": None for key in overrides} for task, overrides in NO_CAMERA_OVERRIDES.items()}


@dataclass(frozen=True)
class Claim:
    claim: str
    study: str
    task: str
    policy: str
    arm: Arm
    where: str
    condition: dict = field(default_factory=dict)
    baseline: Arm = FULL
    measure: str = "success"
    sign: int = 1  # the side of 0 the paper claims
    side_only: bool = False  # a baseline method that claims nothing: its verdict names the side of full attention


@dataclass(frozen=True)
class Fix:  # a training-side fix, measured per encoder and condition (claims.md's tables of its name)
    label: str
    overrides: dict
    encoders: tuple
    study: str = "robustness"
    task: str = "lift"
    policy: str = "bc"
    base: dict = field(default_factory=dict)  # training both sides share, the fix added on top (e.g. recipe=cpu's jitter)
    base_label: str = "papers' setting"


def with_overrides(arm: Arm, overrides: dict) -> Arm:
    return replace(arm, overrides={**arm.overrides, **overrides})


def grid(claim: str, places, arms, settings, baseline: Arm | None = None, **kw) -> list[Claim]:
    """One row per (study, task, policy) x arm x setting, in that order; a setting's training overrides go to both arms."""
    return [Claim(claim, study, task, policy, with_overrides(arm, s.overrides), s.where, s.condition,
                  with_overrides(baseline or FULL, s.overrides), **kw)
            for study, task, policy in places for arm in arms for s in settings]


FIB = Arm("Fibottention", "fibottention")
ROBOT = Arm("Fibottention (robot windows) †", "fibottention", {"attention.windows": "robot"}, authors=True)
MULT = Arm("Fibottention (multiplicative mask) †", "fibottention", {"attention.mask_mode": "multiplicative"}, authors=True)
LOOKHERE = Arm("LookHere-90", "lookhere")
BIGBIRD = Arm("BigBird", "bigbird")
# the field's default encoder (policies/vision/resnet.py): no attention, so its runs record attention=full
RESNET = Arm("ResNet-18", "full", {"policy.encoder": "resnet18"})
PLAIN_LOOKHERE = {"attention.global_slope": "1.0", "attention.rotate_directions": "false", "policy.vit.patch_size": "8",
                  "policy.vit.pool": "cls", "~task.input_shapes.robot0_eye_in_hand_image": None}

def condition(shift: Shift) -> dict:
    """A shift as records hold it (inference options: ``{"corruption": [[kind, severity]]}``)."""
    return {"corruption": [list(shift)]}


def shifted(shifts) -> list[Setting]:
    return [Setting(s.label, condition(s)) for s in shifts]


BRIGHTNESS, CONTRAST = map(condition, PAPERS_PIXEL)
CLEAN = [Setting("clean")]
CORRUPTED = shifted(PAPERS_PIXEL)
SCARCE = [Setting(f"{n} demonstrations", overrides={"train.max_episodes": str(n)}) for n in (10, 25, 50)]
LARGER = [Setting(f"rendered at {n} px", {"image_size": n}) for n in (112, 128)]
# LookHere's global slope scaled by the training size over the rendered one, as the paper does
SLOPE_SCALED = [Setting(f"rendered at {n} px", {"image_size": n, "attention": {"global_slope": 84 / n}}) for n in (112, 128)]
# rendered scene shifts at severity 2 (in the training range of randomised demonstrations): the papers' setting, and
# both arms with recipe=cpu's jitter
SCENE = shifted(Shift(kind, COMPARED_SEVERITY) for kind in SCENE_KINDS)


def jittered(settings: list[Setting]) -> list[Setting]:
    """The same settings, both arms trained with recipe=cpu's jitter."""
    return [replace(s, where=f"{s.where} (recipe=cpu's jitter)", overrides=AUGMENT) for s in settings]


def scene(task: str) -> list[Setting]:
    """The scene shifts ``task`` renders (PushT has no light)."""
    return [s for s in SCENE if s.condition["corruption"][0][0] in scene_kinds_of(task)]


SCENE_JITTER = jittered(SCENE)
# the field's default encoder under the recipe's evaluation (four pixel corruptions) and the scene shifts,
# in the papers' setting and with recipe=cpu's jitter
PIXEL = shifted(RECIPE_PIXEL)
EVERY_SHIFT = [*CLEAN, *PIXEL, *SCENE]
EVERY_SHIFT_JITTER = jittered(EVERY_SHIFT)
DIVERSITY = [Setting("1 − mean pairwise CKA of the heads' outputs")]

LIFT = ("lift", "bc")
MAIN, EFFICIENCY, ROBUSTNESS = ("main", *LIFT), ("data_efficiency", *LIFT), ("robustness", *LIFT)
OTHER_TASKS = [("can", "can", "bc"), ("pusht", "pusht", "diffusion")]  # each task's own study, its CPU recipe's policy
RECIPE_TASKS = [("can_recipe", "can", "bc"), ("pusht_recipe", "pusht", "diffusion")]  # the same with recipe=cpu's jitter
# where each task's recommended recipe lives: Lift and Can train with recipe=cpu's jitter (cells of robustness and
# can_recipe); PushT's recipe dropped it (-12 points clean, full attention, three seeds), so its papers'-setting study
# is its recipe and pusht_recipe holds only what the jitter did there
JITTERED_RECIPES = [ROBUSTNESS, RECIPE_TASKS[0]]
PUSHT = OTHER_TASKS[1]
TASKS = ("lift", "can", "pusht")
SUCCESS, ROBUST, DIVERSE = "Better task success", "More robust to corruptions", "More diverse heads"
SCENE_ROBUST = "More robust to scene shifts"
BASELINE = ": sparse baseline (BigBird; no claim)"

CLAIMS = [
    *grid(f"{SUCCESS} (Fibottention)", [MAIN], [FIB, ROBOT], CLEAN),
    *grid(f"{SUCCESS} (Fibottention)", OTHER_TASKS, [FIB], CLEAN),
    # each claim again under the recommended recipe (recipe=cpu's jitter), where a user trains (Lift's cells: robustness's)
    *grid(f"{SUCCESS} (Fibottention)", JITTERED_RECIPES, [FIB], jittered(CLEAN)),
    *grid(f"{SUCCESS} (LookHere)", [MAIN, *OTHER_TASKS], [LOOKHERE], CLEAN),
    *grid(f"{SUCCESS} (LookHere)", JITTERED_RECIPES, [LOOKHERE], jittered(CLEAN)),
    *grid(SUCCESS + BASELINE, [MAIN], [BIGBIRD], CLEAN, side_only=True),
    *grid("Better with scarce data (Fibottention)", [EFFICIENCY], [FIB], SCARCE),
    *grid("Better with scarce data (LookHere)", [EFFICIENCY], [LOOKHERE], SCARCE),
    *grid(f"{ROBUST} (Fibottention)", [ROBUSTNESS], [FIB, ROBOT, MULT], CORRUPTED),
    *grid(f"{ROBUST} (Fibottention)", OTHER_TASKS, [FIB], CORRUPTED),
    *grid(f"{ROBUST} (Fibottention)", JITTERED_RECIPES, [FIB], jittered(PIXEL)),
    *grid(f"{ROBUST} (Fibottention)", [PUSHT], [FIB], PIXEL[len(CORRUPTED):]),  # PushT's recipe: the papers' setting
    *grid(f"{ROBUST} (LookHere)", [ROBUSTNESS, *OTHER_TASKS], [LOOKHERE], CORRUPTED),
    *grid(f"{ROBUST} (LookHere)", JITTERED_RECIPES, [LOOKHERE], jittered(PIXEL)),
    *grid(f"{ROBUST} (LookHere)", [PUSHT], [LOOKHERE], PIXEL[len(CORRUPTED):]),
    *grid(ROBUST + BASELINE, [ROBUSTNESS], [BIGBIRD], CORRUPTED, side_only=True),
    *grid(f"{SCENE_ROBUST} (Fibottention)", [ROBUSTNESS], [FIB], SCENE),
    *grid(f"{SCENE_ROBUST} (Fibottention)", [("scene_training", *LIFT)], [FIB], SCENE_JITTER),
    *grid(f"{SCENE_ROBUST} (Fibottention)", [RECIPE_TASKS[0]], [FIB], jittered(scene("can"))),
    *grid(f"{SCENE_ROBUST} (Fibottention)", [PUSHT], [FIB], scene("pusht")),
    *grid(f"{SCENE_ROBUST} (LookHere)", [ROBUSTNESS], [LOOKHERE], SCENE),
    # LookHere with the jitter: the encoders study's cells; full attention's are scene_training's (its variant 0)
    *grid(f"{SCENE_ROBUST} (LookHere)", [("encoders", *LIFT)], [LOOKHERE], SCENE_JITTER),
    *grid(f"{SCENE_ROBUST} (LookHere)", [RECIPE_TASKS[0]], [LOOKHERE], jittered(scene("can"))),
    *grid(f"{SCENE_ROBUST} (LookHere)", [PUSHT], [LOOKHERE], scene("pusht")),
    *grid("The field's default encoder (ResNet-18; no claim)", [("encoders", *LIFT)], [RESNET], EVERY_SHIFT + EVERY_SHIFT_JITTER,
          side_only=True),
    *grid("Extrapolates to larger images (LookHere)", [("resolution", *LIFT)], [Arm("lookhere", "lookhere")], LARGER),
    *grid("Extrapolates to larger images (LookHere)", [("resolution", *LIFT)], [Arm("lookhere (s_g scaled)", "lookhere")], SLOPE_SCALED),
    *grid(f"{DIVERSE} (Fibottention)", [("diversity", *LIFT)], [FIB, ROBOT, MULT], DIVERSITY, measure="head_diversity"),
    *grid(f"{DIVERSE} (LookHere)", [("diversity", *LIFT)], [LOOKHERE], DIVERSITY, measure="head_diversity"),
    *grid("The gain needs the sparsity (Fibottention)", [MAIN], [FIB], CLEAN,
          baseline=replace(MULT, label="the same with the public code's multiplicative mask †", authors=False)),
]

VERDICT_SEEDS = 3  # training seeds per side that a verdict needs (one checkpoint swings by about ±10 points)
FEW = f"fewer than {VERDICT_SEEDS} seeds"  # a task whose rows all rest on fewer seeds than a verdict needs
COLLAPSE = 0.5  # a seed "collapses" under a corruption below this success rate (full attention keeps about 0.9)
LOTTERY = [(*ROBUSTNESS, arm, s.condition) for arm in (FULL, FIB, LOOKHERE, BIGBIRD) for s in CORRUPTED]
SCENE_FIX = {"study": "scene_training", "base": AUGMENT, "base_label": "recipe=cpu's jitter"}
FIXES = {"per-image": Fix("per-image input", PER_IMAGE, (FULL, FIB)),
         "augment": Fix("photometric augmentation", AUGMENT, (FULL, FIB, LOOKHERE)),
         "shift": Fix("random shift", SHIFT, (FULL, FIB), **SCENE_FIX),
         "shift-colour": Fix("random shift + hue/saturation", {**SHIFT, **COLOUR}, (FULL, FIB), **SCENE_FIX),
         "randomised": Fix("randomised-scene demonstrations", RANDOMISED, (FULL, FIB), **SCENE_FIX),
         "colour": Fix("hue/saturation jitter", COLOUR, (FULL, FIB), **SCENE_FIX),
         "wrist": Fix("wrist camera", {f"+{k}": v for k, v in WRIST.items()}, (FULL, FIB), **SCENE_FIX),
         "randomised-shift-colour": Fix("randomised scenes + shift + hue/saturation", {**RANDOMISED, **SHIFT, **COLOUR}, (FULL, FIB),
                                        **SCENE_FIX),
         # the recipe's jitter on Can and PushT, against each task's papers'-setting cells (on PushT full attention's
         # three seeds settled it: the recipe dropped the jitter there)
         **{f"augment-{task}": Fix("photometric augmentation", AUGMENT, encoders, study=study, task=task,
                                   policy=policy)
            for (study, task, policy), encoders in zip(RECIPE_TASKS, [(FULL, FIB, LOOKHERE), (FULL,)])},
         # hue/saturation on the other two tasks, against each task's recipe: Can's jitter (can_recipe's cells), PushT's
         # papers' setting (its own study's cells)
         "colour-can": Fix("hue/saturation jitter", COLOUR, (FULL, FIB), study="can_scene_training",
                           task="can", policy="bc", base=AUGMENT, base_label=SCENE_FIX["base_label"]),
         "colour-pusht": Fix("hue/saturation jitter", COLOUR, (FULL, FIB), study="pusht_scene_training",
                             task="pusht", policy="diffusion")}
# the rule for adopting a training fix into a task's recipe, on the means over seeds: clean success within
# ADOPT_CLEAN_MARGIN of the same encoder's recipe, and at least ADOPT_SHIFT_FLOOR under every scene shift the task
# renders (``scene(task)``: severity 2, inside the training range of randomised demonstrations), each on VERDICT_SEEDS seeds
ADOPT_CLEAN_MARGIN, ADOPT_SHIFT_FLOOR = 0.02, 0.90
SCENE_FIXES = ("shift", "shift-colour", "randomised", "colour", "wrist", "randomised-shift-colour", "colour-can", "colour-pusht")
# the README's evidence table: (label, arm, the study of its clean row, of its other conditions, task, policy)
README_CONDITIONS = ({}, BRIGHTNESS, CONTRAST)
README_ROWS = [(label, arm, study, "robustness", *LIFT) for label, arm, study in (
    ("full attention", FULL, "main"), ("Fibottention", FIB, "main"),
    ("Fibottention, the authors' robot windows (`attention.windows=robot`)", ROBOT, "main"),
    ("Fibottention, the public code's multiplicative mask (`attention.mask_mode=multiplicative`)", MULT, "main"),
    ("LookHere-90 (the recipe: + wrist camera, 12-px patches, keypoint read-out, rotated directions)", LOOKHERE, "main"),
    ("plain LookHere-90 (agentview, CLS read-out, 8-px patches)", with_overrides(LOOKHERE, PLAIN_LOOKHERE), "main"),
    ("BigBird (band ±3, CLS, 3 random keys per row; the Fibottention paper's sparse baseline)", BIGBIRD, "main"),
    ("Fibottention, per-image input normalisation (`policy.vit.input_norm=per_image`)", with_overrides(FIB, PER_IMAGE), "robustness"),
    ("full attention, per-image input normalisation", with_overrides(FULL, PER_IMAGE), "robustness"),
    ("Fibottention, photometric augmentation (`recipe=cpu`'s jitter)", with_overrides(FIB, AUGMENT), "robustness"),
    ("full attention, photometric augmentation", with_overrides(FULL, AUGMENT), "robustness"),
    ("LookHere-90 (the recipe's), photometric augmentation", with_overrides(LOOKHERE, AUGMENT), "robustness"))]


@dataclass(frozen=True)
class Recipe:
    """A row of the README's recipe table: a task and policy as ``recipe=cpu`` trains them, and the cells that measured it."""
    task: str
    policy: str
    label: str  # the policy column's text
    pieces: str  # what the recipe sets, and in which files under configs/recipe/
    studies: tuple[str, ...]  # whose records hold its cells (pooled, a cell counted once)
    arms: tuple[Arm, ...]  # its encoders, in the column's order
    pick: bool = False  # a row of "Which to pick": the recommended recipe of its task, measured under the shifts


DIFFUSION = {"policy.down_dims": "[32,64,128]", "policy.prediction_type": "sample"}  # the cells of before policy/cpu/diffusion
LOOKHERE_RECIPE = {"attention.global_slope": "0.25", "attention.rotate_directions": "true", "policy.vit.patch_size": "12",
                   "policy.vit.pool": "spatial_softmax", "+task.input_shapes.robot0_eye_in_hand_image": "[3,84,84]"}
ENCODERS = (FULL, FIB, LOOKHERE)
RECIPES = [
    Recipe("lift", "bc", "bc", "agentview camera uncropped (`task/cpu/lift`), 4000 steps (`pair/cpu/lift_bc`); LookHere adds the wrist "
           "camera, 12-px patches, keypoints, rotated directions, slope 0.25 (`attention/cpu/lift_bc_lookhere`)",
           ("robustness", "scene_training", "encoders"), tuple(with_overrides(a, AUGMENT) for a in ENCODERS), pick=True),
    Recipe("lift", "bc", "bc, `encoder=resnet18`", "as Lift BC, ResNet-18 in place of the ViT (`configs/encoder/resnet18.yaml`)",
           ("encoders",), (with_overrides(RESNET, AUGMENT),)),
    Recipe("lift", "diffusion", "diffusion", "as BC, x0 prediction, U-Net 32-64-128 (`policy/cpu/diffusion`), 5000 steps "
           "(`pair/cpu/lift_diffusion`, `attention/cpu/lift_diffusion_lookhere`)", ("main",),
           (with_overrides(FULL, DIFFUSION), with_overrides(FIB, DIFFUSION), with_overrides(LOOKHERE, {**DIFFUSION, **LOOKHERE_RECIPE}))),
    Recipe("can", "bc", "bc", "both cameras uncropped, 12-px patches, keypoints, 15000 steps (`task/cpu/can`, `preset/keypoint_vit`)",
           ("can_recipe",), tuple(with_overrides(a, AUGMENT) for a in ENCODERS), pick=True),
    Recipe("pusht", "diffusion", "diffusion", "1000 demonstrations, whole 96-px frame, 12-px patches, x0, U-Net 32-64-128, keypoints, "
           "15000 steps, no jitter (`task/cpu/pusht`, `policy/cpu/diffusion`)", ("pusht",), ENCODERS, pick=True),
    Recipe("pusht", "bc", "bc", "PushT diffusion's observation settings (`task/cpu/pusht`); no working recipe yet", ("main",), (FIB,)),
    Recipe("lift", "bc_rnn", "bc_rnn", "Lift BC's observation settings, two steps of low-dim history, LSTM 2×400, GMM 5 modes, "
           "sequences of 10, batch 16, 3000 steps (`policy/cpu/bc_rnn`, `pair/cpu/lift_bc_rnn`)", ("main",), (FIB,)),
    Recipe("can, pusht", "bc_rnn", "bc_rnn (and Can diffusion)", "the matching BC observation settings (`task/cpu/can`, "
           "`task/cpu/pusht`, `policy/cpu/bc_rnn`, `policy/cpu/diffusion`)", (), (FIB,)),
]
