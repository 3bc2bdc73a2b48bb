"""Scene shifts on a robosuite simulation through robosuite's own modders (``robosuite/utils/mjmod.py``).

``LightingModder``, ``CameraModder`` and ``TextureModder`` save the clean scene when they are made and
put it back with ``restore_defaults``; we set their values through their own setters. Two things in
robosuite 1.5.2 need a word with MuJoCo 3.9 (robosuite's own ``DomainRandomizationWrapper`` refuses its
``TextureModder`` unless MuJoCo is 3.1.1):

* MuJoCo 3.2 renamed ``tex_rgb`` to ``tex_data`` and gave each material one texture per role
  (``mat_texid`` is (nmat, roles)): the modders see the model through ``_ModelView``, which answers
  the old names (every texture here has 3 channels; checked);
* the scene's light and Can's bins have no names, which the modders look everything up by:
  ``_ModelView`` takes an id where a name is asked for;
* ``TextureModder.upload_texture`` uploads only when the simulation has no renderer yet: ours uploads
  into the renderer the frames come from.
"""
from __future__ import annotations

import mujoco
import numpy as np
import robosuite.utils.transform_utils as T
from robosuite.utils.mjmod import CameraModder, LightingModder, TextureModder

from .scene_shifts import (
    CAMERA_FOVY_DEG,
    CAMERA_MOVE_M,
    CAMERA_TURN_DEG,
    COLOUR_MIX,
    LIGHT_AMBIENT_ADD,
    LIGHT_DIFFUSE_FACTOR,
    LIGHT_TILT_DEG,
    at_severity,
    either_way,
    unit_vector,
)

SHIFTED_CAMERA = "agentview"
# task -> materials whose textures the colour shift mixes: the surface the object stands on, the object
COLOUR_MATERIALS = {"lift": ("table_ceramic", "cube_redwood_mat"), "can": ("light-wood", "Can_coke")}
_RGB_ROLE = int(mujoco.mjtTextureRole.mjTEXROLE_RGB)


class _ModelView:
    """robosuite's model as its modders expect it (see the module docstring); everything else passes through."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    @property
    def tex_rgb(self):
        return self._model.tex_data

    @property
    def mat_texid(self):
        return self._model.mat_texid[:, _RGB_ROLE]

    def geom_name2id(self, name):
        return name if isinstance(name, int) else self._model.geom_name2id(name)

    def light_name2id(self, name):
        return name if isinstance(name, int) else self._model.light_name2id(name)


class _ModelViewMixin:
    @property
    def model(self):
        return _ModelView(self.sim.model)


class _LightingModder(_ModelViewMixin, LightingModder):
    pass


class _TextureModder(_ModelViewMixin, TextureModder):
    def _cache_checker_matrices(self):
        # checker patterns are not used here, and robosuite builds two int64 matrices per texture
        # (about 100 MB for Lift's 1-3 k px textures)
        self._texture_checker_mats = []

    def upload_texture(self, name, device_id=0):
        context = self.sim._render_context_offscreen
        if context is not None:  # with none yet, the texture is uploaded when one is made
            context.upload_texture(self.get_texture(name).id)


class RobosuiteScene:
    """The modders of one simulation, each made on the clean scene the first time its kind is applied:
    ``apply`` a list of shifts drawn from an episode seed, ``restore`` the clean scene (before every reset;
    it touches only what the last ``apply`` changed: re-uploading Lift's large textures is the costly part)."""

    def __init__(self, sim, task: str):
        self.sim = sim
        self.task = task
        self._modders = {}  # kind -> its modder
        self._changed = ()  # the kinds the last apply changed

    def _modder(self, kind: str):
        if kind not in self._modders:
            mj = self.sim.model._model
            if kind == "lighting":
                self._modders[kind] = _LightingModder(self.sim, light_names=list(range(mj.nlight)))
            elif kind == "camera":
                self._modders[kind] = CameraModder(self.sim, camera_names=[SHIFTED_CAMERA])
            else:
                if np.any(mj.tex_nchannel != 3):
                    raise RuntimeError("the colour shift expects RGB textures; this model has some with alpha")
                geoms = [int(np.flatnonzero(mj.geom_matid == mj.material(name).id)[0])
                         for name in COLOUR_MATERIALS[self.task]]
                self._modders[kind] = _TextureModder(self.sim, geom_names=geoms, randomize_skybox=False,
                                                     texture_variations=("rgb",))
        return self._modders[kind]

    def restore(self, keep=()) -> None:
        """The clean scene back, except for the kinds in ``keep``: the next ``apply`` sets every value those
        change anew from the clean ones (so a colour shift after a colour shift uploads its textures once)."""
        undo = [kind for kind in self._changed if kind not in keep]
        for kind in undo:  # a clean episode after a clean one touches nothing
            self._modders[kind].restore_defaults()
        if undo:
            self._refresh()
        self._changed = tuple(kind for kind in self._changed if kind in keep)

    def apply(self, draws) -> None:
        """``envs.scene_shifts.scene_draws``'s ``[(kind, severity, generator), ...]`` (drawn first: a missing
        seed is refused before anything changes); a severity between the whole ones interpolates the tables."""
        for kind, severity, rs in draws:
            modder = self._modder(kind)
            if kind not in self._changed:  # listed before it changes: the next restore undoes even half an apply
                self._changed += (kind,)
            getattr(self, f"_{kind}")(modder, severity, rs)
        self._refresh()

    def _refresh(self) -> None:
        # camera and light poses in the world are derived quantities: recompute them (and nothing of the physics)
        mujoco.mj_camlight(self.sim.model._model, self.sim.data._data)

    @staticmethod
    def _lighting(m, severity: float, rs) -> None:
        for name in m.light_names:
            turn = T.quat2mat(T.axisangle2quat(unit_vector(rs) * np.radians(at_severity(LIGHT_TILT_DEG, severity))))
            m.set_dir(name, turn @ m._defaults[name]["dir"])
            factor = at_severity(LIGHT_DIFFUSE_FACTOR, severity, clean=1.0) ** either_way(rs)
            m.set_diffuse(name, m._defaults[name]["diffuse"] * factor)
            m.set_ambient(name, m._defaults[name]["ambient"] + at_severity(LIGHT_AMBIENT_ADD, severity))

    @staticmethod
    def _camera(m, severity: float, rs) -> None:
        for name in m.camera_names:
            d = m._defaults[name]
            m.set_pos(name, d["pos"] + unit_vector(rs) * at_severity(CAMERA_MOVE_M, severity))
            turn = T.quat2mat(T.axisangle2quat(unit_vector(rs) * np.radians(at_severity(CAMERA_TURN_DEG, severity))))
            base = T.quat2mat(T.convert_quat(d["quat"], to="xyzw"))
            m.set_quat(name, T.convert_quat(T.mat2quat(turn @ base), to="wxyz"))
            m.set_fovy(name, d["fovy"] + either_way(rs) * at_severity(CAMERA_FOVY_DEG, severity))

    @staticmethod
    def _colour(m, severity: float, rs) -> None:
        m.random_state = rs
        mix = at_severity(COLOUR_MIX, severity)
        for name in m.geom_names:
            # set_rgb(perturb=True)'s mix, (1 - mix) * texture + mix * colour, in float32: its float64 over
            # Lift's 1-2 Mpx textures took most of a second per episode
            colour = m.get_rand_rgb().astype(np.float32) * mix
            m.set_texture(name, m._defaults[name]["texture"] * np.float32(1.0 - mix) + colour)
