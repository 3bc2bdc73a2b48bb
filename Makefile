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

demo: $(STAMP)
	$(PYTHON) -m policies.vision.masks fibottention --grid 9x9 --heads 4 --modified
	$(PYTHON) -m policies.vision.masks lookhere-90 --grid 9x9 --heads 4 --depth 3

bench: $(STAMP)
	$(PYTHON) benchmarks/attention.py --json results/attention_benchmark/cpu.json

clean-venv:
	rm -rf $(VENV)
