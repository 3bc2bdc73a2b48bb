"""The shift vocabulary: every kind, severity and spelling of what changes between the scene and the policy.

Two stages share one form, ``KIND:SEVERITY`` (a ``Shift``):

* **pixel corruptions** act on the rendered frame before the policy sees it (``envs.corruptions`` holds the
  operations): the four hand-written kinds of before, frozen at severities 1-3 (committed records are named
  by them), and ImageNet-C's definitions at their five severities (``LIBRARY_KINDS``);
* **scene shifts** are rendered by the simulator itself (``envs.scene_shifts`` holds the magnitudes and the
  draws): light, colours, camera pose, each at severities 1-3, on the tasks of ``SCENE_KINDS``.

``parse_shifts`` reads an evaluation's shifts, ``parse_randomised_kinds`` a demonstration's randomised scene
kinds; both check kinds with ``check_scene_kind``. A malformed or unknown one is a ``ShiftError`` in one line.
The named sets (``RECIPE_PIXEL``, ``scene_set``) are the ones the studies, the suite and the docs measure.
This module imports nothing of the package: every other module speaks through it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

PIXEL, SCENE = "pixel", "scene"

# the four hand-written pixel kinds (their meaning is frozen: records of before are named by them), severities 1-3
CORRUPTIONS = ("gaussian_noise", "blur", "brightness", "contrast")
SEVERITIES = (1, 2, 3)
# ImageNet-C's kinds as imagecorruptions-imaug defines them. Its gaussian_noise, brightness and contrast are not
# offered (those names mean ours); glass_blur is left out (0.6 s a frame at 84 px, and an unseeded generator of its own)
LIBRARY_KINDS = ("shot_noise", "impulse_noise", "speckle_noise", "defocus_blur", "motion_blur", "zoom_blur",
                 "gaussian_blur", "fog", "frost", "snow", "spatter", "elastic_transform", "pixelate",
                 "jpeg_compression", "saturate")
LIBRARY_SEVERITIES = (1, 2, 3, 4, 5)
PIXEL_SEVERITIES = {**{k: SEVERITIES for k in CORRUPTIONS}, **{k: LIBRARY_SEVERITIES for k in LIBRARY_KINDS}}

SCENE_SEVERITIES = (1, 2, 3)
# kind -> the tasks that can render it (PushT is drawn in 2-D without a light)
SCENE_KINDS = {"lighting": ("lift", "can"), "colour": ("lift", "can", "pusht"), "camera": ("lift", "can", "pusht")}
# randomised demonstrations draw each kind's severity up to this by default: severities 1-2 are in the
# training range, 3 is out of it (the studies read this to keep the two apart in their tables)
TRAINING_RANGE = 2

KINDS = {**{k: PIXEL for k in PIXEL_SEVERITIES}, **{k: SCENE for k in SCENE_KINDS}}


class ShiftError(ValueError):
    """A malformed or unsupported shift (either stage): the CLIs print it as one line."""


class Shift(NamedTuple):
    """One ``KIND:SEVERITY``; a plain ``(kind, severity)`` pair (JSON and records write it as a list)."""

    kind: str
    severity: int

    @property
    def stage(self) -> str:
        """``"pixel"``: a corruption of the observation; ``"scene"``: the environment renders it."""
        return KINDS[self.kind]

    @property
    def tag(self) -> str:
        """The name in folder names, records and study settings: ``brightness1``, ``lighting2``."""
        return f"{self.kind}{self.severity}"

    @property
    def label(self) -> str:
        """The name in tables: ``brightness 1``, ``gaussian noise 2``."""
        return f"{self.kind.replace('_', ' ')} {self.severity}"

    def __str__(self) -> str:
        """The command line's form: ``brightness:1``."""
        return f"{self.kind}:{self.severity}"


# the four pixel corruptions the recipes are measured under (brightness at 1: at 2 every policy fails on Lift)
RECIPE_PIXEL = (Shift("brightness", 1), Shift("contrast", 2), Shift("gaussian_noise", 2), Shift("blur", 2))
# the papers' two pixel corruptions (the first robustness study's)
PAPERS_PIXEL = RECIPE_PIXEL[:2]
COMPARED_SEVERITY = 2  # the scene severity the claims compare: inside the training range of randomised demonstrations


def scene_kinds_of(task: str) -> tuple[str, ...]:
    """The scene shifts ``task`` can render: ("lighting", "colour", "camera") for lift and can."""
    return tuple(kind for kind, tasks in SCENE_KINDS.items() if task in tasks)


def scene_set(task: str, severities=SCENE_SEVERITIES) -> tuple[Shift, ...]:
    """Every scene shift ``task`` renders, at each of ``severities`` (kind by kind)."""
    return tuple(Shift(kind, s) for kind in scene_kinds_of(task) for s in severities)


def severities(kind: str) -> tuple[int, ...]:
    return PIXEL_SEVERITIES[kind] if KINDS[kind] == PIXEL else SCENE_SEVERITIES


def check_scene_kind(kind: str, task: str | None, option: str, shown: str | None = None, hint: str = "") -> None:
    """A scene kind that exists and that ``task`` (when given) can render, else a ``ShiftError`` naming ``option``
    (``hint``: the option's other way out, after the kinds)."""
    shown = shown or kind
    if KINDS.get(kind) != SCENE:
        where, can = (f"the {task} task's", scene_kinds_of(task)) if task else ("the scene shifts", tuple(SCENE_KINDS))
        raise ShiftError(f"{option}={shown}: not a scene shift; {where}: {', '.join(can)}{hint}")
    if task is not None and kind not in scene_kinds_of(task):
        raise ShiftError(f"{option}={shown}: the {task} task cannot render a {kind} shift; its scene shifts: "
                         f"{', '.join(scene_kinds_of(task))}")


def _example(option: str) -> str:
    return f"{option}=camera:1" if option == "scene_shifts" else f"{option}=brightness:1"


def _items(spec, option: str) -> list:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, Mapping) or not hasattr(spec, "__iter__"):  # 42, True, {...}: not KIND:SEVERITY
        raise ShiftError(f"{option}={spec!r}: give KIND:SEVERITY or a list of them, e.g. {_example(option)}")
    return list(spec)


def parse_shift(item, option: str = "corruption") -> Shift:
    """``"brightness:1"`` or a ``(kind, severity)`` pair -> ``Shift``, its kind and severity checked."""
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], int) \
            and not isinstance(item[1], bool):  # already parsed
        kind, severity = str(item[0]), str(item[1])
    elif isinstance(item, str) and item.count(":") == 1:
        kind, severity = item.split(":")
    else:
        raise ShiftError(f"{option}={item!r}: give KIND:SEVERITY, e.g. {_example(option)}")
    if kind not in KINDS:
        raise ShiftError(f"{option}={kind}:{severity}: give KIND:SEVERITY with KIND a pixel corruption "
                         f"({', '.join(PIXEL_SEVERITIES)}) or a scene shift ({', '.join(SCENE_KINDS)})")
    allowed = severities(kind)
    if severity not in tuple(map(str, allowed)):
        raise ShiftError(f"{option}={kind}:{severity}: give KIND:SEVERITY with SEVERITY {allowed[0]}-{allowed[-1]} "
                         f"for {kind}, e.g. {option}={kind}:{allowed[0]}")
    return Shift(kind, int(severity))


def parse_shifts(spec, task: str | None = None, option: str = "corruption") -> list[Shift]:
    """``"lighting:2"``, ``"brightness:1"``, ``[...]`` of them (or of pairs) -> ``[Shift, ...]`` in the order
    given; None or [] -> []. Refused in one line (``ShiftError``): anything that is not KIND:SEVERITY, an
    unknown kind, a severity out of the kind's range, a scene kind twice, and with ``task`` a scene kind that
    task cannot render. ``option`` names the setting in the messages."""
    out = [parse_shift(item, option) for item in _items(spec, option)]
    scene = [s.kind for s in out if s.stage == SCENE]
    if len(set(scene)) < len(scene):
        raise ShiftError(f"{option}: give each scene shift once, got {', '.join(map(str, out))}")
    for s in (s for s in out if s.stage == SCENE):
        check_scene_kind(s.kind, task, option, str(s))
    return out


def parse_scene_shifts(spec, task: str) -> tuple[Shift, ...]:
    """What an environment's ``scene_shifts=`` takes: ``parse_shifts`` for ``task``, scene kinds only (a pixel
    corruption is refused in one line: the caller applies those to observations)."""
    shifts = parse_shifts(spec, task=task, option="scene_shifts")
    pixel = [str(s) for s in shifts if s.stage == PIXEL]
    if pixel:
        raise ShiftError(f"scene_shifts={', '.join(pixel)}: a pixel corruption applies to observations "
                         "(envs.corruptions.obs_corruptor), not to the scene")
    return tuple(shifts)


def parse_randomised_kinds(kinds, max_severity, task: str) -> tuple[tuple[str, ...], int] | None:
    """``scene_randomization=`` and ``scene_randomization_max=`` of generate_demos.py: kinds as a list, one
    kind, ``"lighting,colour"`` or ``"all"`` (every kind ``task`` renders); None or [] -> None (clean scenes).
    Refused in one line (``ShiftError``): an unknown kind, one the task cannot render, a kind twice, a max
    severity outside 1-3, a kind written with a severity."""
    if isinstance(max_severity, bool) or not isinstance(max_severity, int) or max_severity not in SCENE_SEVERITIES:
        raise ShiftError(f"scene_randomization_max={max_severity!r}: give a severity "
                         f"{SCENE_SEVERITIES[0]}-{SCENE_SEVERITIES[-1]} (default {TRAINING_RANGE})")
    if kinds is None or kinds == [] or kinds == ():
        return None
    can = scene_kinds_of(task)
    if isinstance(kinds, str):
        kinds = can if kinds == "all" else [k.strip() for k in kinds.split(",")]
    elif not isinstance(kinds, (list, tuple)) or not all(isinstance(k, str) for k in kinds):
        raise ShiftError(f"scene_randomization={kinds!r}: give scene kinds, e.g. scene_randomization=[{','.join(can)}] "
                         "or scene_randomization=all")
    for kind in kinds:
        if ":" in kind and kind.split(":")[0] in SCENE_KINDS:  # rollout's corruption=kind:severity syntax
            raise ShiftError(f"scene_randomization={kind}: give kinds without a severity, and the highest "
                             f"severity drawn with scene_randomization_max=N (default {TRAINING_RANGE})")
        check_scene_kind(kind, task, "scene_randomization", hint=" (or scene_randomization=all)")
    if len(set(kinds)) < len(kinds):
        raise ShiftError(f"scene_randomization: give each kind once, got {', '.join(kinds)}")
    return tuple(kinds), int(max_severity)


def shift_tag(shifts) -> str | None:
    """[("brightness", 1), ("lighting", 2)] -> "brightness1+lighting2" (folder names, records); [] -> None."""
    return "+".join(Shift(*s).tag for s in shifts) or None


def split_stages(shifts) -> tuple[list[Shift], list[Shift]]:
    """(pixel corruptions for ``obs_corruptor``, scene shifts for the env's ``scene_shifts=``), order kept."""
    shifts = [Shift(*s) for s in shifts]
    return [s for s in shifts if s.stage == PIXEL], [s for s in shifts if s.stage == SCENE]
