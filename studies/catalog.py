"""The studies, as data: what each trains (``python train_policy.py``) and how it evaluates (``python rollout.py``).
A grid (tasks x policies x arms x variants x the budget's seeds) and named rollout settings, whose
``{episodes}``, ``{shifted_episodes}``, ``{workers}`` come from the budget. A new study is one more entry.
"""
from studies.study import Study

ENCODERS = ("attention=full", "attention=fibottention", "attention=lookhere")
# the Fibottention authors' two settings, and the sparse baseline of their paper
AUTHORS = ("attention=fibottention attention.windows=robot", "attention=fibottention attention.mask_mode=multiplicative",
           "attention=bigbird")
CLEAN = "num_episodes={episodes} workers={workers}"
SHIFTED = "num_episodes={shifted_episodes} workers={workers} max_steps=200"  # no success in 110 such episodes took 80 steps
CORRUPTED = {"brightness1": f"{SHIFTED} corruption=brightness:1", "contrast2": f"{SHIFTED} corruption=contrast:2"}
# Can and PushT: corrupted at the task's own horizon (their successes take longer than Lift's 200 steps)
AT_HORIZON = {k: f"num_episodes={{shifted_episodes}} workers={{workers}} corruption={c}" for k, c in
              (("brightness1", "brightness:1"), ("contrast2", "contrast:2"))}
# recipe=cpu as shipped: its photometric jitter (configs/recipe/preset/photometric_aug.yaml), which the
# papers'-setting cells above turn off; measured under the four pixel corruptions at severity 2 (brightness 1)
JITTER = "policy.image_aug.brightness=0.3 policy.image_aug.contrast=0.5"
RECIPE_AT_HORIZON = {**AT_HORIZON, **{k: f"num_episodes={{shifted_episodes}} workers={{workers}} corruption={c}" for k, c in
                                      (("gaussian_noise2", "gaussian_noise:2"), ("blur2", "blur:2"))}}
LARGER = {f"{n}px": f"{SHIFTED} image_size={n}" for n in (112, 128)}

STUDIES = {s.name: s for s in [
    Study("main", tasks=("lift",), policies=("bc",), arms=ENCODERS + AUTHORS, settings={"clean": CLEAN}),
    Study("data_efficiency", ("lift",), ("bc",), ENCODERS, {"clean": CLEAN},
          variants=tuple(f"train.steps=2000 train.max_episodes={n}" for n in (10, 25, 50))),
    Study("robustness", ("lift",), ("bc",), ENCODERS + AUTHORS, {"clean": CLEAN, **CORRUPTED}),
    # the papers' other two tasks, each with the policy of its measured CPU recipe (README "Recipes")
    Study("can", ("can",), ("bc",), ENCODERS, {"clean": CLEAN, **AT_HORIZON}),
    Study("pusht", ("pusht",), ("diffusion",), ENCODERS, {"clean": CLEAN, **AT_HORIZON}),
    # the recommended recipe where it is recommended: Can BC and PushT diffusion with recipe=cpu's jitter
    Study("can_recipe", ("can",), ("bc",), ENCODERS, {"clean": CLEAN, **RECIPE_AT_HORIZON}, variants=(JITTER,)),
    Study("pusht_recipe", ("pusht",), ("diffusion",), ENCODERS, {"clean": CLEAN, **RECIPE_AT_HORIZON}, variants=(JITTER,)),
    Study("resolution", ("lift",), ("bc",), ENCODERS,
          {"clean": CLEAN, **LARGER, **{f"{k}_slope": f"{v} global_slope={84 / int(k[:-2])}" for k, v in LARGER.items()}},
          only={"112px_slope": "attention=lookhere", "128px_slope": "attention=lookhere"}),
]}
