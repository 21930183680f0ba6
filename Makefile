# Two entry points, each self-contained on a fresh machine:
#   make demo   - the main job (builds lscore in .venv-demo and runs `lscore demo`)
#   make test   - the test suite (builds lscore in .venv-test and runs pytest, the examples of
#                 README.md and docs/ included)
#   make docs   - the documentation site (.venv-docs) into docs/_build/html, warnings as errors
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q
BUILD_DEPS = "setuptools>=69" "cython>=3.0" "numpy>=2.0" wheel

.PHONY: demo test docs bench sanitize clean venv-test venv-demo venv-docs

.venv-%/bin/python:
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install $(PIP_FLAGS) --upgrade pip
	.venv-$*/bin/pip install $(PIP_FLAGS) $(BUILD_DEPS)

venv-test: .venv-test/bin/python
	.venv-test/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[test,torch,peers]"
	bash scripts/install_mpi.sh .venv-test

venv-demo: .venv-demo/bin/python
	.venv-demo/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[demo]"

venv-docs: .venv-docs/bin/python
	.venv-docs/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[docs,torch]"

test: venv-test
	bash scripts/run_tests.sh .venv-test

demo: venv-demo
	.venv-demo/bin/lscore demo --out out

docs: venv-docs
	rm -rf docs/_build
	.venv-docs/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

# the compiled core under ASan + UBSan, in its own venv (.venv-asan)
sanitize:
	bash scripts/sanitize.sh

bench: venv-test
	.venv-test/bin/lscore bench

clean:
	rm -rf .venv-test .venv-demo .venv-docs .venv-asan build docs/_build *.egg-info _ext/*.so _ext/*.c out
