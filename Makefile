# Two commands on a fresh machine: `make test` and `make demo`. Both set everything up first.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SYS_PKGS := libegl1 libgl1-mesa-dri libosmesa6
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup sysdeps test demo bench clean-venv

setup: $(STAMP)

# EGL through Mesa renders MuJoCo without a display or GPU.
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
	@touch $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest tests

# The main job on a CPU in well under 20 minutes: 50 scripted PushT demonstrations -> a small
# diffusion policy with a Fibottention ViT -> 10 evaluation rollouts.
DEMO_DATA := data/demo/pusht.zarr
DEMO_RUN := outputs/demo
demo: $(STAMP)
	$(PYTHON) -m policies.vision.masks fibottention --grid 10x10 --heads 4 --depth 3
	@test -e $(DEMO_DATA) || $(PYTHON) -m datasets.generate task=pusht num_episodes=50 out=$(DEMO_DATA) workers=2
	$(PYTHON) train_policy.py task=pusht policy=diffusion attention=fibottention task.dataset.path=$(DEMO_DATA) \
	  run_dir=$(DEMO_RUN) overwrite=true train.steps=1500 train.batch_size=32 train.warmup_steps=100 \
	  train.checkpoint_every=500 train.val_every=500 train.num_threads=1
	$(PYTHON) rollout.py checkpoint=$(DEMO_RUN) num_episodes=10 workers=2 out_dir=$(DEMO_RUN)/eval
	@echo "demo outputs: dataset $(DEMO_DATA), checkpoints $(DEMO_RUN)/checkpoints, TensorBoard $(DEMO_RUN)/tb, rollout summary and videos $(DEMO_RUN)/eval"

bench: $(STAMP)
	$(PYTHON) -m benchmarks.attention --sizes 81,256,1024,4096 --repeats 5 --json results/attention_benchmark/cpu.json

clean-venv:
	rm -rf $(VENV)
