# Entry points, each self-contained on a fresh machine:
#   make demo   - the main job (builds lscore in .venv-demo and runs `lscore demo`)
#   make test   - the test suite (builds lscore in .venv-test and runs pytest, the examples of
#                 README.md and docs/ included)
#   make docs   - the documentation site (.venv-docs) into docs/_build/html, warnings as errors
#   make lint   - ruff check, ruff format --check and mypy (pinned, in .venv-lint)
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q
BUILD_DEPS = "setuptools>=77" "cython>=3.0" "numpy>=2.0" wheel
# the lint tools, pinned (.pre-commit-config.yaml runs the same versions), and the
# libraries whose types mypy reads (torch through constraints.txt)
LINT_DEPS = ruff==0.17.6 mypy==2.4.1 numpy==2.4.6 torch

.PHONY: demo test docs lint typecheck typecheck-only bench sanitize clean venv-test venv-demo venv-docs venv-lint

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

# mypy checks lscore as it installs: a strict editable install links the package layout
# (lscore._ext <- _ext/ with the compiled modules' .pyi stubs, lscore.adapters <-
# adapters/) into build/__editable__.*, the links follow edits to the sources, and mypy
# runs from there (from the repository root it would take ./lscore, which has neither)
venv-lint: .venv-lint/bin/python
	.venv-lint/bin/pip install $(PIP_FLAGS) -c constraints.txt $(LINT_DEPS)
	.venv-lint/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation --no-deps \
		--config-settings editable_mode=strict -e .
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

test: venv-test
	bash scripts/run_tests.sh .venv-test

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
	rm -rf .venv-test .venv-demo .venv-docs .venv-asan .venv-lint .mypy_cache .ruff_cache build docs/_build *.egg-info _ext/*.so _ext/*.c out
