"""Scene shifts: what changes between two afternoons in a lab, rendered by the simulator itself.

``lighting`` (the scene light's direction, diffuse intensity and ambient term), ``colour`` (the table's
and the task object's colours; PushT: background, T block, goal region) and ``camera`` (agentview's
position, orientation and field of view; PushT: a shift, turn and zoom of the drawn view), at severities
1-3. Each severity has a fixed magnitude (the tables below); the direction of the change (which way the
light tilts, the camera moves, the colour it mixes towards) is drawn from a generator seeded by
(episode seed, kind, severity), never from the environment's own generator, so a shifted episode starts
from exactly the state of the clean episode of the same seed, and the same seed shows the same scene.

The environments apply them (``RobosuiteEnv`` / ``PushTEnv`` ``scene_shifts=[(kind, severity), ...]`` or
``set_scene_shifts``), restoring the clean scene at every reset. Lift and Can use robosuite's own
modders (``envs/robosuite_scene.py``), PushT its own drawing (``envs/pusht.py``). This module holds the
tables and the draws only: it imports neither simulator.
"""
from __future__ import annotations

import zlib

import numpy as np

SCENE_SEVERITIES = (1, 2, 3)
# kind -> the tasks that can render it (PushT is drawn in 2-D without a light)
SCENE_KINDS = {"lighting": ("lift", "can"), "colour": ("lift", "can", "pusht"), "camera": ("lift", "can", "pusht")}

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


def scene_kinds_of(task: str) -> tuple[str, ...]:
    """The scene shifts ``task`` can render: ("lighting", "colour", "camera") for lift and can."""
    return tuple(kind for kind, tasks in SCENE_KINDS.items() if task in tasks)


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
