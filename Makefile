# tff_comp: `make run` runs the main job, `make test` the test suite (both install first).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint typecheck format docs test-slow test-ray bench bench-aggregators bench-peers reproduce clean

install: $(STAMP)

$(STAMP): requirements/tff.txt requirements/dev.txt requirements/ray.txt setup.cfg
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "error: $(PYTHON) not found. tff_comp needs Python 3.11 (TensorFlow Federated 0.87 supports 3.9-3.11)."; \
	  echo "Install it (e.g. 'apt-get install python3.11 python3.11-venv' or 'pyenv install 3.11') or run 'make PYTHON=/path/to/python3.11'."; \
	  exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "error: $(PYTHON) is Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'), need 3.11."; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# setuptools below 80.9: TensorBoard 2.14 imports pkg_resources (82 removed it; 80.9+ warn on import).
	$(PY) -m pip install --quiet --upgrade pip 'setuptools<80.9' wheel
	$(PY) -m pip install --quiet -r requirements/tff.txt -r requirements/dev.txt \
	  -r requirements/ray.txt
	# TFF itself without its unsatisfiable jax/jaxlib 0.4.14 pins (BUILD_NOTES.md).
	$(PY) -m pip install --quiet --no-deps tensorflow-federated==0.87.0
	$(PY) -m pip install --quiet --no-deps -e .
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -c "import tensorflow_federated, tff_comp, tff_comp.tasks, tff_comp.binaries; print('tff_comp installed with TFF', tensorflow_federated.__version__)"
	touch $(STAMP)

# The main job: FedDualAvg on federated LASSO (built-in generated data). Resumed: run
# again, it reports the finished run (or continues one stopped with Ctrl-C).
run: install
	$(PY) binaries/run.py --algo=feddualavg --task=lasso --resume

# The linter, the formatter's check and the type checker (pyproject.toml); CI runs it
# before the tests.
lint: install typecheck
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy over tff_comp/ (and the contracts tests/type_contracts.py holds it to) from its own virtual environment (requirements/types.txt says why),
# reading .venv's packages; pyproject.toml lists the modules not yet clean.
TYPES := .venv-types
$(TYPES)/.installed: requirements/types.txt
	test -x $(TYPES)/bin/python || $(PYTHON) -m venv $(TYPES)
	$(TYPES)/bin/python -m pip install --quiet -r requirements/types.txt
	touch $@

typecheck: install $(TYPES)/.installed
	$(TYPES)/bin/mypy --python-executable $(PY) tff_comp tests/type_contracts.py

# The API reference from the docstrings (binaries/api_docs.py): build/api/index.html.
# Fails on any warning pdoc gives; CI builds it.
docs: install
	$(PY) binaries/api_docs.py --output_dir=build/api

format: install
	$(PY) -m ruff check --fix --select I,F401 .
	$(PY) -m ruff format .

# Two test processes, whole files each (module fixtures run once).
test: install
	$(PY) -m pytest -q -n 2 --dist loadfile

test-slow: install
	$(PY) -m pytest -q -m slow

# The Ray runtime's tests, every one (the default suite runs a few).
test-ray: install
	$(PY) -m pytest -q -m "ray or not slow" tests/test_ray.py tests/test_script_promises.py

bench: install
	$(PY) binaries/bench.py

# Part 9: what aggregator chains cost a round (binaries/bench_aggregators.py).
bench-aggregators: install
	$(PY) binaries/bench.py --workload=aggregators

# Parts 1 and 6 with their peers timed in the same run, each in its own virtual environment
# (their JAX, PyTorch, Ray and protobuf cannot share TFF's pins): FedJAX, pfl-research
# and Flower (requirements/fedjax.txt, pfl.txt, flower.txt; binaries/bench_peers.py).
FEDJAX_VENV ?= .venv-fedjax
PFL_VENV ?= .venv-pfl
FLOWER_VENV ?= .venv-flower
$(FEDJAX_VENV)/.installed: requirements/fedjax.txt
	test -x $(FEDJAX_VENV)/bin/python || $(PYTHON) -m venv $(FEDJAX_VENV)
	$(FEDJAX_VENV)/bin/python -m pip install --quiet -r requirements/fedjax.txt
	touch $@
$(PFL_VENV)/.installed: requirements/pfl.txt
	test -x $(PFL_VENV)/bin/python || $(PYTHON) -m venv $(PFL_VENV)
	$(PFL_VENV)/bin/python -m pip install --quiet -r requirements/pfl.txt
	touch $@
$(FLOWER_VENV)/.installed: requirements/flower.txt
	test -x $(FLOWER_VENV)/bin/python || $(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/python -m pip install --quiet -r requirements/flower.txt
	touch $@

PEERS = --fedjax_python=$(FEDJAX_VENV)/bin/python --pfl_python=$(PFL_VENV)/bin/python \
  --flower_python=$(FLOWER_VENV)/bin/python
bench-peers: install $(FEDJAX_VENV)/.installed $(PFL_VENV)/.installed $(FLOWER_VENV)/.installed
	$(PY) binaries/bench.py $(PEERS) --sweep= --tff_workers=0 --nofirst_rounds --repeats=5
	$(PY) binaries/bench.py $(PEERS) --workload=emnist_cnn --rounds=5 --repeats=3

reproduce: install
	$(PY) binaries/reproduce.py --experiment=fco_lasso

clean:
	rm -rf $(VENV) $(FEDJAX_VENV) $(PFL_VENV) $(FLOWER_VENV) $(TYPES) runs *.egg-info
