# Two commands on a fresh machine: `make test` and `make demo`. Both set everything up first.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SYS_PKGS := libegl1 libgl1-mesa-dri libosmesa6 ffmpeg
# lerobot's reader/writer for tests/test_lerobot.py, without its dependencies (they would move numpy to 2.x
# and pin huggingface-hub < 0.36): the pieces it imports, at versions that work with numpy 1.26; torchcodec
# (its video backend) needs FFmpeg's shared libraries: the ffmpeg system package above.
LEROBOT_CHECK := lerobot-dataset==0.4.4 datasets==4.1.1 "pandas>=2.2,<2.4" pytz deepdiff==8.6.2 orderly-set==5.5.0 \
  jsonlines==4.0.0 attrs dill==0.4.0 multiprocess==0.70.16 xxhash torchcodec==0.17.0
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup sysdeps test demo demo-pusht bench clean-venv

setup: $(STAMP)

# EGL through Mesa renders MuJoCo without a display or GPU; FFmpeg's libraries serve torchcodec (tests only).
sysdeps:
	@missing=""; for p in $(SYS_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing system packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "error: missing system packages:$$missing"; \
	    echo "run: sudo apt-get install -y$$missing   (then rerun make)"; exit 1; \
	  fi; \
	fi

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory sysdeps
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q -U pip setuptools wheel
	$(PYTHON) -m pip install -q -e '.[dev]'
	$(PYTHON) -m pip install -q --no-deps $(LEROBOT_CHECK)
	@touch $(STAMP)

# The suite in TEST_WORKERS processes (pytest-xdist): 2 uses both cores of the 2-core machine it is sized
# for; TEST_WORKERS=auto takes one per core, TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PYTHON) -m pytest -n $(TEST_WORKERS) tests

# The CPU recipe end to end in under 20 minutes on 2 cores: 200 scripted Lift demonstrations ->
# BC with a Fibottention ViT (recipe=cpu, two processes under torchrun) -> 20 held-out rollouts.
DEMO_RUN := outputs/demo
LIFT_DATA := data/lift/ph_image.hdf5
demo: $(STAMP)
	$(PYTHON) -m policies.vision.masks fibottention --grid 10x10 --heads 4 --depth 3
	@test -e $(LIFT_DATA) || $(PYTHON) generate_demos.py task=lift num_episodes=200 workers=2
	$(VENV)/bin/torchrun --standalone --nproc_per_node=2 train_policy.py task=lift policy=bc attention=fibottention \
	  recipe=cpu run_dir=$(DEMO_RUN) overwrite=true
	$(PYTHON) rollout.py checkpoint=$(DEMO_RUN) num_episodes=20 workers=2 overwrite=true
	@echo "demo outputs: dataset $(LIFT_DATA), checkpoints $(DEMO_RUN)/checkpoints, TensorBoard: tensorboard --logdir $(DEMO_RUN)/tb, rollout summary and videos $(DEMO_RUN)/eval/"

# PushT with the CPU recipe (x0 diffusion, keypoints): 1000 demonstrations and 15000 steps, about an hour.
PUSHT_DATA := data/pusht/demos1000.zarr
demo-pusht: $(STAMP)
	@test -e $(PUSHT_DATA) || $(PYTHON) generate_demos.py task=pusht num_episodes=1000 out=$(PUSHT_DATA) workers=2
	$(VENV)/bin/torchrun --standalone --nproc_per_node=2 train_policy.py task=pusht policy=diffusion attention=fibottention \
	  recipe=cpu run_dir=outputs/demo_pusht overwrite=true
	$(PYTHON) rollout.py checkpoint=outputs/demo_pusht num_episodes=20 workers=2 overwrite=true

bench: $(STAMP)
	$(PYTHON) -m benchmarks.attention --sizes 81,256,1024,4096 --repeats 5 --json results/attention_benchmark/cpu.json

clean-venv:
	rm -rf $(VENV)
