"""A dataset from elsewhere is untrusted input (issue 42): every path derived from it stays inside it,
its metadata is checked against its data, decoding is sized before it allocates; the exporter writes
only inside its out, overwrites only what it wrote, refuses an out inside a dataset before reading the
source; a full disk during generation or export is one line that leaves nothing behind; generation
overwrites only a dataset it generated, and the zarr and hdf5 readers check memory before reading."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from common.paths import UntrustedPathError, fill_template, plain_name
from core.config import load_task
from datasets.export import ExportConfig, export, write_lerobot
from datasets.factory import make_dataset, read_dataset
from datasets.generate import GENERATE, check_out, generate
from datasets.lerobot import describe_lerobot, read_lerobot
from datasets.robomimic_hdf5 import GENERATED_BY, generated_by, read_robomimic_hdf5, write_robomimic_hdf5
from datasets.zarr_replay import read_pusht_zarr, write_pusht_zarr
from tests.helpers import REPO, run_command
from tests.test_lerobot import PUSHT, _pusht_episodes

av = pytest.importorskip("av")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

VIDEO = "videos/observation.image/chunk-000/file-000.mp4"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
FRAME_BYTES = 96 * 96 * 3  # one PushT camera frame, uint8


@pytest.fixture(scope="module")
def pusht_zarr(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "pusht.zarr"
    write_pusht_zarr(path, _pusht_episodes(), attrs={"task": "pusht"})  # episodes of 12, 9, 7 frames
    return path


@pytest.fixture(scope="module")
def exported(pusht_zarr, tmp_path_factory):
    out = tmp_path_factory.mktemp("le") / "pusht_lerobot"
    export(ExportConfig(src=str(pusht_zarr), out=str(out), codec="h264"), load_task)
    return out


@pytest.fixture
def root(exported, tmp_path):
    """A copy of the export at tmp_path/ds/le, to damage."""
    copy = tmp_path / "ds" / "le"
    shutil.copytree(exported, copy)
    return copy


def _edit_info(root, **changes):
    info = json.loads((root / "meta/info.json").read_text())
    info.update(changes)
    (root / "meta/info.json").write_text(json.dumps(info))
    return info


def _edit_episodes(root, column, index, value):
    path = root / EPISODES
    table = pq.read_table(path)
    values = table.column(column).to_numpy().copy()
    values[index] = value
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values)), path)


def _tree_digest(path) -> str:
    """One hash of every file's name and bytes under ``path``: equal before and after = untouched."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------- the helpers
def test_templates_allow_only_the_documented_fields():
    fields = {"video_key": "observation.image", "chunk_index": 1, "file_index": 2}
    assert fill_template("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index}.mp4", fields, "t") == \
        "videos/observation.image/chunk-001/file-2.mp4"
    for bad in ("{video_key.__class__.__name__}", "{video_key[0]}", "{video_key!r}", "{other}", "{}",
                "{chunk_index:{file_index}}", "{chunk_index:0999999999d}", "{video_key:>9}", "{"):
        with pytest.raises(UntrustedPathError, match="meta/info.json's video_path"):
            fill_template(bad, fields, "meta/info.json's video_path")


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "", "a\\b"])
def test_feature_names_must_be_plain(name):
    with pytest.raises(UntrustedPathError, match="not a plain name"):
        plain_name(name, "feature")
    assert plain_name("observation.images.top", "feature") == "observation.images.top"


# ------------------------------------------------------------- item 1: no path leads out of the root
def _outside_video(root, relative):
    """A real video outside the dataset, at ``relative`` to the dataset root: what a hostile info.json points at."""
    target = (root / relative).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / VIDEO, target)
    return target


@pytest.mark.parametrize("case", ["absolute", "climbing", "attribute", "feature"])
def test_the_reader_opens_no_file_outside_the_root(root, case):
    features = PUSHT
    if case == "absolute":
        _edit_info(root, video_path=str(_outside_video(root, "../elsewhere/secret.mp4")))
        match = r"video_path for 'observation.image' \(chunk 0, file 0\) is an absolute path"
    elif case == "climbing":
        _outside_video(root, "../evil/x.mp4")
        _edit_info(root, video_path="../evil/x.mp4")
        match = r"video_path for 'observation.image' \(chunk 0, file 0\) \(../evil/x.mp4\) leads outside"
    elif case == "attribute":
        _edit_info(root, video_path="videos/{video_key.__class__.__name__}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
        match = r"has the field \{video_key.__class__.__name__\}; only \{video_key\}, \{chunk_index\}, \{file_index\}"
    else:  # a feature named ../../x whose video (videos/../../x/...) lies beside the dataset
        info = json.loads((root / "meta/info.json").read_text())
        info["features"]["../../x"] = info["features"].pop("observation.image")
        (root / "meta/info.json").write_text(json.dumps(info))
        table = pq.read_table(root / EPISODES)
        pq.write_table(table.rename_columns([c.replace("observation.image", "../../x") for c in table.column_names]),
                       root / EPISODES)
        _outside_video(root, "videos/../../x/chunk-000/file-000.mp4")
        features = {**PUSHT, "image": "../../x"}
        match = r"feature '../../x' is not a plain name"
    with pytest.raises(UntrustedPathError, match=match) as exc:
        read_lerobot(root, ["image", "agent_pos"], features)
    assert "\n" not in str(exc.value)


def test_a_symbolic_link_out_of_the_root_is_refused(root, tmp_path):
    data = root / "data/chunk-000/file-000.parquet"
    elsewhere = tmp_path / "elsewhere.parquet"
    shutil.move(data, elsewhere)
    data.symlink_to(elsewhere)
    with pytest.raises(UntrustedPathError, match="through a symbolic link, .* leads outside"):
        read_lerobot(root, ["agent_pos"], PUSHT)


def test_a_zarr_chunk_linked_out_of_the_store_is_refused(pusht_zarr, tmp_path):
    store = tmp_path / "copy.zarr"
    shutil.copytree(pusht_zarr, store)
    chunk = next(p for p in sorted((store / "data" / "action").iterdir()) if not p.name.startswith("."))
    secret = tmp_path / "secret.bin"
    shutil.move(chunk, secret)
    chunk.symlink_to(secret)
    with pytest.raises(UntrustedPathError, match=rf"data/action/{chunk.name}, a symbolic link, .* leads outside"):
        read_dataset(store)


@pytest.mark.parametrize("kind", ["external link", "external storage"])
def test_an_hdf5_that_points_at_other_files_is_refused(tmp_path, kind):
    import h5py

    from datasets.robomimic_hdf5 import read_robomimic_hdf5, write_robomimic_hdf5

    episodes = [{"actions": np.zeros((5, 7), np.float32), "obs": {"robot0_eef_pos": np.zeros((5, 3), np.float32)}}] * 2
    path = tmp_path / "demo.hdf5"
    write_robomimic_hdf5(path, episodes, {"env_name": "Lift", "type": 1, "env_kwargs": {}})
    secret = tmp_path / "secret.bin"  # any file of the user's, read as the demo's positions
    secret.write_bytes(np.arange(15, dtype=np.float32).tobytes())
    with h5py.File(path, "a") as f:
        del f["data/demo_0/obs/robot0_eef_pos"]
        if kind == "external link":
            with h5py.File(tmp_path / "other.hdf5", "w") as other:
                other["x"] = np.ones((5, 3), np.float32)
            f["data/demo_0/obs/robot0_eef_pos"] = h5py.ExternalLink(str(tmp_path / "other.hdf5"), "/x")
        else:
            f["data/demo_0/obs"].create_dataset("robot0_eef_pos", shape=(5, 3), dtype=np.float32,
                                                external=[(str(secret), 0, secret.stat().st_size)])
    match = "is an external link to" if kind == "external link" else f"is stored in {secret}"
    with pytest.raises(UntrustedPathError, match=rf"data/demo_0/obs/robot0_eef_pos {match}.*copy that data into the file"):
        read_robomimic_hdf5(path, obs_keys=["robot0_eef_pos"])


def test_describe_names_a_video_path_that_leads_out(root):
    _edit_info(root, video_path="../evil/x.mp4")
    problems = describe_lerobot(root)["problems"]
    assert any("(../evil/x.mp4) leads outside" in p for p in problems), problems


def test_the_exporter_writes_nothing_outside_out(pusht_zarr, tmp_path):
    data = read_dataset(pusht_zarr)
    out = tmp_path / "a" / "out"
    with pytest.raises(UntrustedPathError, match="feature name '../../x' is not a plain name"):
        write_lerobot(out, data, {**{k: k for k in data.data}, "image": "../../x"}, fps=10, task_text="pusht")
    assert list(tmp_path.rglob("*")) == []  # neither out nor a video beside it


# --------------------------------------------------------- item 2: metadata the data contradicts
def test_a_dataset_at_another_rate_than_the_task_is_refused(pusht_zarr, tmp_path):
    out = tmp_path / "le30"
    export(ExportConfig(src=str(pusht_zarr), out=str(out), fps=30, codec="h264"), load_task)
    task = load_task("pusht")
    task.dataset.path = str(out)
    with pytest.raises(ValueError, match=r"recorded at 30 fps but task 'pusht' runs at 10 fps \(task.fps\)"):
        make_dataset(task)


def test_timestamps_that_contradict_the_fps_are_refused(root):
    _edit_info(root, fps=30)  # the frames lie 0.1 s apart
    with pytest.raises(ValueError, match=r"frame 1 of episode 0 lies 0.1000 s after the one before, "
                                         r"but meta/info.json's fps \(30\)"):
        read_lerobot(root, ["agent_pos"], PUSHT)


@pytest.mark.parametrize("case, edits, match", [  # episodes of 12, 9 and 7 frames: bounds 0-12, 12-21, 21-28
    ("overlap", [("dataset_from_index", 1, 10), ("length", 1, 11)],
     "episode 1 starts at dataset index 10 but episode 0 ends at 12: it overlaps"),
    ("gap", [("dataset_from_index", 1, 13), ("length", 1, 8)],
     "episode 1 starts at dataset index 13 but episode 0 ends at 12: it leaves a gap"),
    ("past the data", [("dataset_to_index", 2, 40), ("length", 2, 19)],
     r"the last episode \(2\) ends at dataset index 40 but data/ holds 28 frames"),
])
def test_episode_bounds_that_do_not_tile_the_data_are_refused(root, case, edits, match):
    for column, index, value in edits:
        _edit_episodes(root, column, index, value)
    with pytest.raises(ValueError, match=match):
        read_lerobot(root, ["image", "agent_pos"], PUSHT)
    assert not describe_lerobot(root)["valid"]


# ------------------------------------------------------------------ item 3: memory before decoding
def test_decoding_more_than_the_memory_is_refused_before_allocating(root):
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.image"]["shape"] = [60000, 60000, 3]  # 282 GiB for 28 frames
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"decoding .* \(28 frames of 60000x60000x3\) needs 5\d\d.\d GiB of memory but "
                                         r"[\d.]+ GiB is available; .*train.max_episodes=N"):
        read_lerobot(root, ["image", "agent_pos"], PUSHT)


def test_max_episodes_decodes_only_what_fits(root, monkeypatch):
    import common.resources

    # every frame (28 kept + 28 of the one file decoded) needs 56 frames; the first episode 12 + 13
    monkeypatch.setattr(common.resources, "available_memory", lambda: 30 * FRAME_BYTES)
    with pytest.raises(ValueError, match=r"needs 1.5 MiB of memory but 0.8 MiB is available"):
        read_lerobot(root, ["image", "agent_pos"], PUSHT)
    data = read_lerobot(root, ["image", "agent_pos"], PUSHT, max_episodes=1)
    assert data.num_episodes == 1 and data.data["image"].shape == (12, 96, 96, 3)


# ---------------------------------------------------- items 4 and 5: what the exporter may touch
def test_overwrite_deletes_no_folder_the_exporter_did_not_write(pusht_zarr, tmp_path):
    project = tmp_path / "project"
    (project / "meta").mkdir(parents=True)
    (project / "meta/info.json").write_text("{}")
    (project / "README.md").write_text("my notes")
    result = run_command(["export_dataset.py", f"src={pusht_zarr}", f"out={project}", "overwrite=true"])
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "not a dataset written by export_dataset.py (no .export marker)" in result.stderr
    assert (project / "README.md").read_text() == "my notes" and (project / "meta/info.json").read_text() == "{}"


def test_overwrite_of_an_export_refuses_files_added_to_it(exported, pusht_zarr, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(exported, copy)
    (copy / "meta/annotations.json").write_text("[]")
    with pytest.raises(FileExistsError, match="holds meta/annotations.json, which export_dataset.py did not write"):
        export(ExportConfig(src=str(pusht_zarr), out=str(copy), overwrite=True), load_task)
    assert (copy / "meta/annotations.json").read_text() == "[]"


@pytest.mark.parametrize("where, match", [
    ("data/export", "lies inside src="),
    (".", "is the source itself"),
    ("..", "lies inside out="),
])
def test_an_out_in_or_around_the_source_is_refused_before_reading(root, monkeypatch, where, match):
    import datasets.factory

    monkeypatch.setattr(datasets.factory, "read_dataset", lambda *a, **k: pytest.fail("the source was read"))
    before = _tree_digest(root.parent)
    with pytest.raises(ValueError, match=match):
        export(ExportConfig(src=str(root), out=str(root / where), task="pusht", overwrite=True), load_task)
    assert _tree_digest(root.parent) == before


def test_an_out_inside_another_dataset_is_refused(exported, pusht_zarr, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(exported, other)
    with pytest.raises(ValueError, match=f"lies inside the dataset {other}"):
        export(ExportConfig(src=str(pusht_zarr), out=str(other / "data" / "new")), load_task)
    assert not (other / "data" / "new").exists()


# ------------------------------------------------------------------------ item 6: one line, not a traceback
@pytest.mark.parametrize("args, message", [
    (["crf=99"], "crf=99 is out of range for codec=av1: choose 0-63"),
    (["codec=h264", "crf=-1"], "crf=-1 is out of range for codec=h264: choose 0-51"),
    (["gop=0"], "gop must be >= 1"),
])
def test_export_options_out_of_range_are_one_line(pusht_zarr, tmp_path, args, message):
    result = run_command(["export_dataset.py", f"src={pusht_zarr}", f"out={tmp_path / 'o'}", *args])
    assert result.returncode == 1 and result.stderr.startswith(f"export_dataset.py: error: {message}")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "o").exists()


def _with_file_limit(kib: int, args: list[str]) -> subprocess.CompletedProcess:
    """A command run as ``ulimit -f KIB`` leaves it: no file it writes may grow past KIB KiB (a full disk)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl"}
    return subprocess.run(["bash", "-c", f'ulimit -f {kib}; exec "$0" "$@"', sys.executable, *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_full_disk_during_export_is_one_line_and_leaves_nothing(pusht_zarr, tmp_path):
    out = tmp_path / "out"
    result = _with_file_limit(4, ["export_dataset.py", f"src={pusht_zarr}", f"out={out}", "codec=h264"])
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"export_dataset.py: error: could not write {out}/{VIDEO}: file too large")
    assert f"nothing was written at {out} (the partial export was removed)" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no out, no temporary sibling


def test_a_full_disk_during_generation_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "demos.zarr"
    result = _with_file_limit(8, ["generate_demos.py", "task=pusht", "num_episodes=1", f"out={out}"])
    last = result.stderr.strip().splitlines()[-1]  # the progress bar comes before it
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert last.startswith(f"generate_demos.py: error: could not write {out}: file too large")
    assert "nothing was written there (the partial file was removed" in last
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_hdf5_raises_one_clean_error(tmp_path):
    """HDF5 hitting the limit mid-file printed pages of errors and crashed the interpreter: the file
    is built in memory and written in one plain write, which fails with one OSError."""
    script = (
        "import errno, numpy as np\n"
        "from datasets.robomimic_hdf5 import write_robomimic_hdf5\n"
        "rng = np.random.default_rng(0)\n"
        "eps = [{'actions': rng.uniform(-1, 1, (50, 7)).astype(np.float32),\n"
        "        'obs': {'agentview_image': rng.integers(0, 255, (50, 84, 84, 3), dtype=np.uint8)}} for _ in range(2)]\n"
        "try:\n"
        f"    write_robomimic_hdf5({str(tmp_path / 'x.hdf5')!r}, eps, {{'env_name': 'Lift', 'type': 1, 'env_kwargs': {{}}}})\n"
        "except OSError as exc:\n"
        "    print('errno', exc.errno)\n"
    )
    result = _with_file_limit(50, ["-c", script])
    assert result.returncode == 0 and result.stdout.strip() == f"errno {errno.EFBIG}" and result.stderr == "", result.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------- generation overwrites only a dataset it generated
def _no_episodes(monkeypatch):
    """Every refusal comes before the first episode: running one fails the test."""
    import datasets.generate

    monkeypatch.setattr(datasets.generate, "_collect", lambda job: pytest.fail("an episode ran"))


def _lift_hdf5(path, lengths=(6, 5, 4), attrs=None):
    """A small robomimic file (84x84 camera, 7-D actions), marked with ``attrs`` in its data group."""
    rng = np.random.default_rng(0)
    episodes = [{"actions": rng.uniform(-1, 1, (n, 7)).astype(np.float32),
                 "obs": {"agentview_image": rng.integers(0, 255, (n, 84, 84, 3), dtype=np.uint8),
                         "robot0_eef_pos": rng.uniform(-1, 1, (n, 3)).astype(np.float32)}} for n in lengths]
    return write_robomimic_hdf5(path, episodes, {"env_name": "Lift", "type": 1, "env_kwargs": {}}, attrs=attrs)


def test_generate_overwrite_refuses_a_zarr_it_did_not_generate(pusht_zarr, tmp_path, monkeypatch):
    """A PushT replay buffer downloaded, brought, or generated before the mark existed is no dataset
    generate wrote: overwrite=true refuses it, before any episode, and leaves it as it was."""
    _no_episodes(monkeypatch)
    brought = tmp_path / "brought.zarr"
    shutil.copytree(pusht_zarr, brought)
    before = _tree_digest(brought)
    with pytest.raises(FileExistsError, match=r"out=.*brought.zarr is a folder holding .zattrs, .zgroup, data/, meta/, "
                                              r"not a dataset written by generate_demos.py \(no .generate marker: "
                                              r"datasets it generated before the mark existed carry none\); overwrite=true "
                                              r"replaces only a dataset it generated: choose another out= or remove it yourself"):
        generate("pusht", 1, brought, overwrite=True, progress=False)
    assert _tree_digest(brought) == before


def test_generate_overwrite_refuses_files_added_to_a_generated_zarr(tmp_path, monkeypatch):
    _no_episodes(monkeypatch)
    out = write_pusht_zarr(tmp_path / "gen.zarr", _pusht_episodes(), owner=GENERATE)  # as generate writes it
    check_out(out, "pusht", overwrite=True)  # its own dataset, untouched: replaceable
    (out / "data" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds data/notes.txt, which generate_demos.py did not write; "
                                              r"overwrite=true replaces only what it wrote"):
        generate("pusht", 1, out, overwrite=True, progress=False)
    assert (out / "data" / "notes.txt").read_text() == "mine" and read_pusht_zarr(out).num_episodes == 3


def test_generate_overwrite_refuses_an_hdf5_it_did_not_generate(tmp_path, monkeypatch):
    _no_episodes(monkeypatch)
    brought = _lift_hdf5(tmp_path / "image.hdf5")
    before = brought.read_bytes()
    with pytest.raises(FileExistsError, match=r"out=.*image.hdf5 is a file \(\d+ bytes\), not a dataset written by "
                                              r"generate_demos.py \(no generated_by attribute in its data group: datasets "
                                              r"it generated before the mark existed carry none\)"):
        generate("lift", 1, brought, overwrite=True, progress=False)
    assert brought.read_bytes() == before
    generated = _lift_hdf5(tmp_path / "gen.hdf5", attrs={GENERATED_BY: GENERATE.command})
    assert generated_by(generated) == "generate_demos.py"
    check_out(generated, "lift", overwrite=True)  # what generate wrote is replaceable


def test_generate_overwrite_of_a_foreign_dataset_is_one_line(pusht_zarr, tmp_path):
    brought = tmp_path / "brought.zarr"
    shutil.copytree(pusht_zarr, brought)
    result = run_command(["generate_demos.py", "task=pusht", "num_episodes=1", f"out={brought}", "overwrite=true"])
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"generate_demos.py: error: out={brought} is a folder holding")
    assert "not a dataset written by generate_demos.py (no .generate marker" in result.stderr
    assert read_pusht_zarr(brought).num_episodes == 3


def test_the_exporter_and_the_generator_share_one_ownership_rule(pusht_zarr, tmp_path):
    """An export is not a generated dataset, nor the reverse: each command replaces only what it wrote."""
    from datasets.export import EXPORTER

    generated = write_pusht_zarr(tmp_path / "gen.zarr", _pusht_episodes(), owner=GENERATE)
    with pytest.raises(FileExistsError, match="not a dataset written by export_dataset.py"):
        EXPORTER.check_replaceable(generated)
    exported = tmp_path / "le"
    export(ExportConfig(src=str(pusht_zarr), out=str(exported), codec="h264"), load_task)
    with pytest.raises(FileExistsError, match="not a dataset written by generate_demos.py"):
        GENERATE.check_replaceable(exported)


# -------------------------------------------- memory before reading a zarr or an hdf5 dataset
ZARR_FRAME_BYTES = FRAME_BYTES + (5 + 2) * (4 + 4)  # img uint8; state and action as read (float32) and as float32


def _memory(monkeypatch, available: int) -> None:
    import common.resources

    monkeypatch.setattr(common.resources, "available_memory", lambda: available)


def test_reading_a_zarr_larger_than_the_memory_is_refused_before_reading(pusht_zarr, monkeypatch):
    import datasets.zarr_replay

    actions = read_pusht_zarr(pusht_zarr).data["action"]
    _memory(monkeypatch, 20 * ZARR_FRAME_BYTES)  # 28 frames do not fit, the first episode's 12 do
    with monkeypatch.context() as m:
        m.setattr(datasets.zarr_replay, "_read_image", lambda *a: pytest.fail("the images were read"))
        with pytest.raises(ValueError, match=r"reading .*pusht.zarr \(28 frames: img 96x96x3, state 5, action 2\) needs "
                                             r"0.7 MiB of memory but 0.5 MiB is available; .*train.max_episodes=N reads "
                                             r"only the first N"):
            read_pusht_zarr(pusht_zarr)
    data = read_pusht_zarr(pusht_zarr, max_episodes=1)
    assert data.num_episodes == 1 and data.data["image"].shape == (12, 96, 96, 3)
    assert np.array_equal(data.data["action"], actions[:12])


def test_train_max_episodes_reaches_the_zarr_reader(pusht_zarr, monkeypatch):
    task = load_task("pusht")
    task.dataset.path = str(pusht_zarr)
    _memory(monkeypatch, 20 * ZARR_FRAME_BYTES)
    with pytest.raises(ValueError, match="needs 0.7 MiB of memory"):
        make_dataset(task)
    assert make_dataset(task, max_episodes=1).num_frames == 12


def test_reading_an_hdf5_larger_than_the_memory_is_refused_before_reading(tmp_path, monkeypatch):
    import datasets.robomimic_hdf5

    path = _lift_hdf5(tmp_path / "lift.hdf5")  # demos of 6, 5 and 4 frames
    frame = 84 * 84 * 3 + (3 + 7) * 4  # camera uint8, eef pos and actions float32
    _memory(monkeypatch, 12 * frame)  # 15 frames (and one demo read at a time) do not fit, the first demo does
    with monkeypatch.context() as m:
        m.setattr(datasets.robomimic_hdf5, "_read", lambda *a, **k: pytest.fail("a demo was read"))
        with pytest.raises(ValueError, match=r"reading .*lift.hdf5 \(15 frames: action 7, agentview_image 84x84x3, "
                                             r"robot0_eef_pos 3\) needs 0.4 MiB of memory but 0.2 MiB is available; "
                                             r".*train.max_episodes=N"):
            read_robomimic_hdf5(path)
    data = read_dataset(path, max_episodes=1)
    assert data.num_episodes == 1 and data.data["agentview_image"].shape == (6, 84, 84, 3)
