"""Scene shifts: what changes between two afternoons in a lab, rendered by the simulator itself.

``lighting`` (the scene light's direction, diffuse intensity and ambient term), ``colour`` (the table's
and the task object's colours; PushT: background, T block, goal region) and ``camera`` (agentview's
position, orientation and field of view; PushT: a shift, turn and zoom of the drawn view), at severities
1-3. Each severity has a fixed magnitude (the tables below); the direction of the change (which way the
light tilts, the camera moves, the colour it mixes towards) is drawn from a generator seeded by
(episode seed, kind, severity), never from the environment's own generator, so a shifted episode starts
from exactly the state of the clean episode of the same seed, and the same seed shows the same scene.

The environments apply them (``RobosuiteEnv`` / ``PushTEnv`` ``scene_shifts=[(kind, severity), ...]`` or
``set_scene_shifts``), restoring the clean scene at every reset.

Randomised demonstrations (``generate_demos.py scene_randomization=[...]``) go through the same drawing
with a continuous severity: ``SceneRandomization`` draws, per episode and kind, a severity uniformly in
[0, max_severity] and the magnitudes in between the tables' are interpolated (``at_severity``; 0 is the
clean scene). ``TRAINING_RANGE`` is the max_severity the recipe's randomised demonstrations use: an
evaluation severity above it is out of the training range. Lift and Can use robosuite's own
modders (``envs/robosuite_scene.py``), PushT its own drawing (``envs/pusht.py``). This module holds the
magnitudes and the draws only (kinds, severities and parsing are ``envs.shifts``'); it imports neither simulator.
"""
from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np

from .shifts import SCENE_SEVERITIES, TRAINING_RANGE, parse_randomised_kinds

# the severity word of a randomised episode's generator (scene_random_state): the fixed severities are 1-3,
# so a randomised scene never draws the directions of an evaluation shift of the same seed
RANDOMISED_STREAM = 0

# magnitudes at severities 1, 2, 3 (the direction of each change is drawn per episode)
LIGHT_TILT_DEG = (10.0, 20.0, 35.0)  # the light's direction turns by this about a random axis
LIGHT_DIFFUSE_FACTOR = (1.3, 1.6, 2.0)  # diffuse intensity times this, or divided by it (drawn)
LIGHT_AMBIENT_ADD = (0.05, 0.1, 0.2)  # added to the light's ambient term (0 in robosuite's scenes)
CAMERA_MOVE_M = (0.005, 0.015, 0.04)  # agentview moves this far in a random direction: 5 mm to 4 cm
CAMERA_TURN_DEG = (1.0, 2.5, 5.0)  # and turns by this about a random axis
CAMERA_FOVY_DEG = (1.0, 2.5, 5.0)  # and its vertical field of view (45 degrees) widens or narrows by this
COLOUR_MIX = (0.2, 0.45, 0.75)  # each coloured surface mixed this far towards a random colour
PUSHT_MOVE_PX = (6.0, 15.0, 35.0)  # PushT's view moves by this, of its 512 px, in a random direction
PUSHT_TURN_DEG = (1.0, 2.5, 5.0)  # and turns by this, either way
PUSHT_ZOOM = (1.03, 1.07, 1.15)  # and zooms in by this or out by its inverse (drawn)


def at_severity(table, severity: float, clean: float = 0.0) -> float:
    """The magnitude of ``table`` (its values at severities 1, 2, 3) at ``severity``: exactly the table's at
    a whole severity, linear in between, and from ``clean`` (no change) at 0 up to severity 1."""
    if float(severity).is_integer() and int(severity) in SCENE_SEVERITIES:
        return table[int(severity) - 1]
    return float(np.interp(severity, (0, *SCENE_SEVERITIES), (clean, *table)))


def scene_random_state(seed: int | None, kind: str, severity: int) -> np.random.RandomState:
    """The generator of one shifted episode's draws, from (episode seed, kind, severity) alone.

    A ``RandomState`` because robosuite's modders and ``random_axis_angle`` take only that kind.
    The kind enters as its CRC-32, a number that is the same in every process (``hash`` is not)."""
    if seed is None:
        raise ValueError(f"a {kind} shift is drawn from the episode's seed: give reset(seed=...)")
    seq = np.random.SeedSequence([int(seed), zlib.crc32(kind.encode()), int(severity)])
    return np.random.RandomState(np.random.MT19937(seq))


def unit_vector(rs: np.random.RandomState) -> np.ndarray:
    """A direction drawn uniformly on the sphere."""
    v = rs.standard_normal(3)
    return v / np.linalg.norm(v)


def either_way(rs: np.random.RandomState) -> float:
    """+1 or -1, drawn."""
    return 1.0 if rs.uniform() < 0.5 else -1.0


def mixed_colour(default, mix: float, rs: np.random.RandomState) -> tuple[int, int, int]:
    """An RGB colour (0-255) ``mix`` of the way from ``default`` to a drawn colour."""
    target = rs.uniform(0, 255, size=3)
    return tuple(int(round(c)) for c in (1.0 - mix) * np.asarray(default[:3], dtype=np.float64) + mix * target)


def scene_draws(shifts, seed: int | None, randomization: "SceneRandomization | None" = None) -> list[tuple]:
    """What an episode renders: ``[(kind, severity, generator), ...]`` for the fixed shifts ``[(kind,
    severity), ...]`` of an evaluation, or for a randomised demonstration's kinds (a severity drawn in
    [0, max_severity] first, then the directions from the same generator)."""
    draws = [(kind, severity, scene_random_state(seed, kind, severity)) for kind, severity in shifts]
    if randomization is not None:
        draws += randomization.draw(seed)
    return draws


class SceneRandomization(NamedTuple):
    """Scenes drawn per episode for demonstrations: each of ``kinds`` at a severity drawn uniformly in
    [0, ``max_severity``] from the episode seed (a plain pair: it travels to generation workers)."""

    kinds: tuple
    max_severity: int = TRAINING_RANGE

    def draw(self, seed: int | None) -> list[tuple]:
        out = []
        for kind in self.kinds:
            rs = scene_random_state(seed, kind, RANDOMISED_STREAM)
            out.append((kind, rs.uniform(0.0, self.max_severity), rs))
        return out

    def attrs(self) -> dict:
        """What a dataset records (``scene_randomization`` in its attributes)."""
        return {"kinds": list(self.kinds), "max_severity": int(self.max_severity),
                "severity": f"uniform in [0, {self.max_severity}] per episode and kind, from the episode seed",
                "training_range": f"severities 1-{self.max_severity} in range, above out of range"}


def in_training_range(kind: str, severity: int, randomization: SceneRandomization | None) -> bool:
    """An evaluation shift ``kind:severity`` lies within what demonstrations randomised by ``randomization``
    showed (its kind randomised, its severity at most the max); None (clean demonstrations): never."""
    return randomization is not None and kind in randomization.kinds and severity <= randomization.max_severity


def scene_randomization_for(randomization, task: str) -> SceneRandomization | None:
    """An environment's ``scene_randomization=``: a ``SceneRandomization`` (or its ``(kinds, max_severity)``)
    checked for ``task`` by the vocabulary's parser (``envs.shifts.parse_randomised_kinds``); None: none."""
    if randomization is None:
        return None
    kinds, max_severity = randomization
    parsed = parse_randomised_kinds(list(kinds), max_severity, task)
    return None if parsed is None else SceneRandomization(*parsed)


def check_one_scene_source(shifts, randomization) -> None:
    """An episode renders fixed shifts (evaluation) or randomised scenes (demonstrations), never both: a kind
    in both would be applied twice."""
    if shifts and randomization is not None:
        raise ValueError("scene_shifts and scene_randomization together: give scene_shifts to evaluate under a "
                         "shift, scene_randomization to render demonstrations under drawn scenes, not both")
