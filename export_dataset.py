"""Write any dataset the package reads (.zarr, .hdf5, LeRobot root) as a LeRobotDataset v3.0.

    python export_dataset.py src=data/pusht/demos.zarr out=data/pusht/demos_lerobot
    python export_dataset.py src=data/lift/ph_image.hdf5 out=data/lift/lerobot codec=h264 overwrite=true

Options: ExportConfig in datasets/export.py (the library this calls); the task's config
(configs/task/<task>.yaml) names the features and the fps.
"""
import functools
import os
import sys
from dataclasses import fields

from core.cli import quiet_ctrl_c, run_command

PROG = "export_dataset.py"
quiet_ctrl_c(PROG)  # first: a Ctrl-C during the imports below (seconds) ends in one line too

from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from core.config import load_task  # noqa: E402
from datasets.export import SVT_LOG_ERRORS, ExportConfig, run  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("SVT_LOG", SVT_LOG_ERRORS)  # SVT-AV1 prints its whole configuration otherwise
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ExportConfig), OmegaConf.from_dotlist(args))
    except OmegaConfBaseException as exc:  # a key ExportConfig lacks, a value of the wrong type: one line
        options = ", ".join(f.name for f in fields(ExportConfig))
        print(f"{PROG}: error: {str(exc).splitlines()[0]} (options: {options}; see ExportConfig in datasets/export.py)",
              file=sys.stderr)
        raise SystemExit(1) from None
    run_command(PROG, functools.partial(run, load_task=load_task), cfg)


if __name__ == "__main__":
    main()
