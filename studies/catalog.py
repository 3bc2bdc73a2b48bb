"""The studies, as data: what each trains (``python train_policy.py``) and how it evaluates (``python rollout.py``).
A grid (tasks x policies x arms x variants x the budget's seeds) of override mappings and named rollout
settings, whose "{episodes}", "{shifted_episodes}", "{workers}" come from the budget. A new study is one more entry.
"""
from envs.shifts import COMPARED_SEVERITY, PAPERS_PIXEL, RECIPE_PIXEL, SCENE_SEVERITIES, scene_set
from studies.study import Study

# training overrides the studies vary, defined here once (studies.evidence's claims and fixes name them)
PER_IMAGE = {"policy.vit.input_norm": "per_image"}
AUGMENT = {"policy.image_aug.brightness": "0.3", "policy.image_aug.contrast": "0.5"}  # torchvision ColorJitter per image
# training that survives the scene (study scene_training), each on top of recipe=cpu's jitter
SHIFT = {"policy.image_aug.shift": "4"}  # DrQ's 4 px on 84-px images
COLOUR = {"policy.image_aug.hue": "0.1", "policy.image_aug.saturation": "0.5"}
# generate_demos.py task=lift out=data/lift/ph_image_scene.hdf5 scene_randomization=all (severities up to
# envs.shifts.TRAINING_RANGE = 2: severity 3 lies outside the training range)
RANDOMISED = {"task.dataset.path": "data/lift/ph_image_scene.hdf5"}
# the wrist camera beside agentview (robomimic's image observations): a view that a moved agentview does not move.
# The command line's form; the records name it "+task..." (recipe=cpu drops the key that task=lift has)
WRIST = {"task.input_shapes.robot0_eye_in_hand_image": "[3,84,84]"}
# the blind floor: the policy without a camera (recipe=cpu already drops Lift's wrist camera), what every camera
# variant must beat under a shift (it never sees a frame, so one clean floor holds under every visual shift)
NO_CAMERA = {"lift": {"task.input_shapes.agentview_image": "null"}}
# training for a moved camera (study camera): the affine warp on half the images, matched to camera 1-2's turn, zoom
# and move; demonstrations rendered under drawn camera poses over severities 1-3
# (generate_demos.py task=lift scene_randomization=camera scene_randomization_max=3 out=data/lift/ph_image_camera3.hdf5);
# the same with each frame's pose as a ray map (the policy told where its camera is)
AFFINE = {"policy.image_aug.shift": "4", "policy.image_aug.rotate": "3", "policy.image_aug.scale": "0.06",
          "policy.image_aug.geometric_p": "0.5"}
CAMERA_DEMOS = {"task.dataset.path": "data/lift/ph_image_camera3.hdf5"}
RAY_MAPS = {**CAMERA_DEMOS, "+task.input_shapes.agentview_camera": "[13]", "policy.ray_maps": "true"}
FULL, FIB, LOOKHERE = {"attention": "full"}, {"attention": "fibottention"}, {"attention": "lookhere"}
RESNET = {"attention": "full", "policy.encoder": "resnet18"}  # the field's default encoder: no attention (configs/encoder/resnet18.yaml)
ENCODERS = (FULL, FIB, LOOKHERE)
# the Fibottention authors' two settings, and the sparse baseline of their paper
AUTHORS = ({**FIB, "attention.windows": "robot"}, {**FIB, "attention.mask_mode": "multiplicative"}, {"attention": "bigbird"})
CLEAN = {"num_episodes": "{episodes}", "workers": "{workers}"}
AT_HORIZON = {"num_episodes": "{shifted_episodes}", "workers": "{workers}"}  # Can and PushT: their successes take longer
SHIFTED = {**AT_HORIZON, "max_steps": "200"}  # Lift: no success in 110 such episodes took 80 steps
CORRUPTIONS = {s.tag: str(s) for s in PAPERS_PIXEL}  # setting name -> rollout.py's corruption=, e.g. brightness1: brightness:1
# recipe=cpu as shipped: its photometric jitter (configs/recipe/preset/photometric_aug.yaml), which the
# papers'-setting cells turn off (AUGMENT, above); measured under the four pixel corruptions at severity 2 (brightness 1)
RECIPE_CORRUPTIONS = {s.tag: str(s) for s in RECIPE_PIXEL}


def corrupted(options: dict, corruptions: dict) -> dict:
    return {name: {**options, "corruption": c} for name, c in corruptions.items()}


# training that survives the scene (Lift BC, recipe=cpu with its jitter): DrQ's random shift, with hue and saturation
# jitter beside it, and demonstrations rendered under randomised scenes (generate_demos.py scene_randomization=all,
# severities up to envs.shifts.TRAINING_RANGE = 2: severity 3 is out of the training range)
SCENE_TRAINING = (AUGMENT, {**AUGMENT, **SHIFT}, {**AUGMENT, **SHIFT, **COLOUR}, {**AUGMENT, **RANDOMISED},
                  {**AUGMENT, **RANDOMISED, **SHIFT, **COLOUR},
                  # hue/saturation without the shift: the shift made every policy stop looking (probes.vision_reliance)
                  {**AUGMENT, **COLOUR},
                  # a second view that a moved agentview leaves where it was
                  {**AUGMENT, **WRIST})


def scene_shifts(task: str, severities=SCENE_SEVERITIES) -> dict:
    """The scene shifts ``task`` renders (PushT has no light), at each of ``severities``."""
    return {s.tag: str(s) for s in scene_set(task, severities)}


def scene_shifts_of(task: str, kind: str) -> dict:
    """One scene kind at every severity."""
    return {s.tag: str(s) for s in scene_set(task) if s.kind == kind}


AT_2 = (COMPARED_SEVERITY,)  # severity 2 alone: the level the claims compare (inside the training range of randomised demonstrations)


LARGER = {f"{n}px": {**SHIFTED, "image_size": str(n)} for n in (112, 128)}
SLOPE_SCALED = {f"{n}px_slope": {**SHIFTED, "image_size": str(n), "global_slope": str(84 / n)} for n in (112, 128)}

STUDIES = {s.name: s for s in [
    Study("main", tasks=("lift",), policies=("bc",), arms=ENCODERS + AUTHORS, settings={"clean": CLEAN}),
    Study("data_efficiency", ("lift",), ("bc",), ENCODERS, {"clean": CLEAN},
          variants=tuple({"train.steps": "2000", "train.max_episodes": str(n)} for n in (10, 25, 50))),
    Study("robustness", ("lift",), ("bc",), ENCODERS + AUTHORS,
          {"clean": CLEAN, **corrupted(SHIFTED, CORRUPTIONS), **corrupted(SHIFTED, scene_shifts("lift", AT_2))}),
    # the papers' other two tasks, each with the policy of its measured CPU recipe (README "Recipes")
    Study("can", ("can",), ("bc",), ENCODERS, {"clean": CLEAN, **corrupted(AT_HORIZON, CORRUPTIONS)}),
    # PushT's recipe is the papers' setting (its recipe dropped the jitter), so its study holds the recipe's shifts too
    Study("pusht", ("pusht",), ("diffusion",), ENCODERS,
          {"clean": CLEAN, **corrupted(AT_HORIZON, {**RECIPE_CORRUPTIONS, **scene_shifts("pusht", AT_2)})}),
    # the recommended recipe where it is recommended: Can BC and PushT diffusion with recipe=cpu's jitter, under the
    # pixel corruptions and the scene shifts the task renders; on PushT full attention's three seeds showed the
    # jitter's clean cost (the recipe dropped it there), so no other encoder is trained with it
    *(Study(f"{task}_recipe", (task,), (policy,), arms,
            {"clean": CLEAN, **corrupted(AT_HORIZON, {**RECIPE_CORRUPTIONS, **scene_shifts(task, AT_2)})}, variants=(AUGMENT,),
            shares=(task,))  # the jitter set against the task's papers'-setting cells
      for task, policy, arms in (("can", "bc", ENCODERS), ("pusht", "diffusion", (FULL,)))),
    Study("scene_training", ("lift",), ("bc",), (FULL, FIB),
          {"clean": CLEAN, **corrupted(SHIFTED, {**scene_shifts("lift"), **RECIPE_CORRUPTIONS})}, variants=SCENE_TRAINING),
    # the variant that kept Lift's clean success (hue/saturation) on the other two tasks, on top of each task's recipe
    # (Can's jitter; PushT's papers' setting), under the shifts its scene renders at every severity
    *(Study(f"{task}_scene_training", (task,), (policy,), (FULL, FIB),
            {"clean": CLEAN, **corrupted(AT_HORIZON, {**scene_shifts(task), **RECIPE_CORRUPTIONS})}, variants=(variant,),
            shares=(recipe,))  # set against the task's recipe: Can's jitter cells, PushT's papers' setting
      for task, policy, variant, recipe in (("can", "bc", {**AUGMENT, **COLOUR}, "can_recipe"), ("pusht", "diffusion", COLOUR, "pusht"))),
    # the field's default encoder beside the three ViTs, in the papers' setting and with recipe=cpu's jitter (the ViT
    # cells are those of robustness and scene_training: same overrides, same run directories)
    Study("encoders", ("lift",), ("bc",), (RESNET, *ENCODERS), {"clean": CLEAN, **corrupted(SHIFTED, {**RECIPE_CORRUPTIONS, **scene_shifts("lift", AT_2)})},
          variants=({}, AUGMENT), shares=("robustness", "scene_training")),
    Study("resolution", ("lift",), ("bc",), ENCODERS, {"clean": CLEAN, **LARGER, **SLOPE_SCALED},
          only={name: LOOKHERE for name in SLOPE_SCALED}),
    # a moved camera (Lift BC on recipe=cpu, its jitter included): the blind floor, then each camera variant under the
    # camera shifts at every severity (screened on one seed, confirmed on three)
    Study("camera", ("lift",), ("bc",), (FULL, FIB), {"clean": CLEAN, **corrupted(SHIFTED, scene_shifts_of("lift", "camera"))},
          variants=tuple({**AUGMENT, **v} for v in (NO_CAMERA["lift"], AFFINE, CAMERA_DEMOS, RAY_MAPS))),
]}
