# Two entry points, each self-contained on a fresh machine:
#   make demo   - the main job (builds lscore in .venv-demo and runs `lscore demo`)
#   make test   - the test suite (builds lscore in .venv-test and runs pytest)
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q
BUILD_DEPS = "setuptools>=69" "cython>=3.0" "numpy>=2.0" wheel

.PHONY: demo test bench sanitize clean venv-test venv-demo

.venv-%/bin/python:
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install $(PIP_FLAGS) --upgrade pip
	.venv-$*/bin/pip install $(PIP_FLAGS) $(BUILD_DEPS)

venv-test: .venv-test/bin/python
	.venv-test/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[test,torch,peers]"
	bash scripts/install_mpi.sh .venv-test

venv-demo: .venv-demo/bin/python
	.venv-demo/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[demo]"

test: venv-test
	bash scripts/run_tests.sh .venv-test

demo: venv-demo
	.venv-demo/bin/lscore demo --out out

# the compiled core under ASan + UBSan, in its own venv (.venv-asan)
sanitize:
	bash scripts/sanitize.sh

bench: venv-test
	.venv-test/bin/lscore bench

clean:
	rm -rf .venv-test .venv-demo .venv-asan build *.egg-info _ext/*.so _ext/*.c out
