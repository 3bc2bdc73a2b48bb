"""Figures are written whole: the old picture stays until the new one is complete, and no temporary file is left."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from common.figures import save_png  # noqa: E402


def test_a_figure_replaces_the_old_picture_whole_and_a_failed_draw_keeps_it(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"the old picture")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_png(fig, path, dpi=50)
    assert path.read_bytes()[:4] == b"\x89PNG" and sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]
    assert not plt.get_fignums()  # closed: a report drawing many figures does not keep them all
    drawn = path.read_bytes()
    fig, ax = plt.subplots()

    def interrupted(target, **options):  # a Ctrl-C halfway through the write
        open(target, "wb").write(b"half a pict")
        raise KeyboardInterrupt

    fig.savefig = interrupted
    with pytest.raises(KeyboardInterrupt):
        save_png(fig, path, dpi=50)
    assert path.read_bytes() == drawn and sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]
    assert not plt.get_fignums()
