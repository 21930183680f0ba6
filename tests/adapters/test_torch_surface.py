"""lscore.adapters.torch.GradScaler as a user reads it: torch's signatures, docstrings that
name the right parameters, warnings that point at the user's line, the float16 advice in
the message, and torch's private attributes assignable as torch's own tests assign them."""

from __future__ import annotations

import doctest
import inspect
import re
import warnings

import pytest

torch = pytest.importorskip("torch")

from lscore.adapters.torch import GradScaler

TorchScaler = torch.amp.GradScaler
# torch's public methods (what code written against torch calls)
PUBLIC = sorted(
    name
    for name, value in vars(TorchScaler).items()
    if not name.startswith("_") and callable(value)
)


def _parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_signatures_are_torchs(name: str) -> None:
    """torch's parameters, in torch's order, then keyword-only extras (load_state_dict's
    adopt_policy), so that every call written against torch works unchanged."""
    ours = _parameters(getattr(GradScaler, name))
    theirs = _parameters(getattr(TorchScaler, name))
    assert ours[: len(theirs)] == theirs
    assert all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in ours[len(theirs) :])


def test_constructor_takes_torchs_arguments_then_keyword_only_extras() -> None:
    ours = _parameters(GradScaler.__init__)
    theirs = _parameters(TorchScaler.__init__)
    assert ours[: len(theirs)] == theirs
    assert all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in ours[len(theirs) :])


def _doc_parameters(doc: str) -> list[str]:
    """The names a numpydoc Parameters section lists (``a, b : type`` lines)."""
    section = re.search(r"Parameters\n-+\n(.*?)(\n\n[A-Z][a-z]+\n-+\n|\Z)", doc, re.S)
    assert section, doc
    names = []
    for line in section.group(1).splitlines():
        m = re.match(r"(\w+(?:, \w+)*) :", line)
        if m:
            names += m.group(1).split(", ")
    return names


def test_class_docstring_lists_every_constructor_argument() -> None:
    doc = inspect.getdoc(GradScaler)
    assert _doc_parameters(doc) == list(inspect.signature(GradScaler).parameters)
    assert '"auto"' in doc and "allow_fp16_params" in doc


def test_class_docstring_example_runs() -> None:
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(GradScaler, "GradScaler", globs={})
    assert test.examples
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
    assert result.failed == 0


def _own_methods() -> list[str]:
    return sorted(
        name
        for name, value in vars(GradScaler).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )


@pytest.mark.parametrize("name", _own_methods())
def test_every_public_method_documents_its_own_parameters(name: str) -> None:
    """Each method has its own docstring (not torch's, inherited), naming each parameter
    as the signature spells it."""
    value = vars(GradScaler)[name]
    doc = value.__doc__
    assert doc and doc.strip(), name
    if isinstance(value, property):
        return
    for p in list(inspect.signature(value).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        assert re.search(rf"`{p.name}`|^\s*{p.name} :", doc, re.M), (name, p.name)


def test_setters_name_their_parameter() -> None:
    for name in ("set_growth_factor", "set_backoff_factor"):
        doc = inspect.getdoc(getattr(GradScaler, name))
        assert "`new_factor`" in doc and "new_scale" not in doc, name


# ---- warnings point at the caller's line ---------------------------------------------------


def test_enabled_auto_warning_points_at_the_callers_line() -> None:
    m = torch.nn.Linear(3, 2)
    s = GradScaler("cpu", enabled="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        s.scale(m(torch.ones(2, 3)).sum())
    (w,) = [w for w in caught if "enabled='auto'" in str(w.message)]
    assert (w.filename, w.lineno) == (__file__, line)
    assert not s.is_enabled()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for a machine without CUDA")
def test_no_cuda_warning_points_at_the_callers_line() -> None:
    with pytest.warns(UserWarning, match="CUDA is not available") as caught:
        line = inspect.currentframe().f_lineno + 1
        GradScaler("cuda")
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_float16_parameter_advice_is_in_the_message() -> None:
    m = torch.nn.Linear(3, 2).half()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s = GradScaler("cpu")
    s.scale(m(torch.ones(1, 3).half()).float().sum()).backward()
    with pytest.raises(ValueError) as e:
        s.unscale_(opt)
    message = str(e.value)
    assert message.startswith("Attempting to unscale FP16 gradients. ")
    assert "float32 master weights" in message and "allow_fp16_params=True" in message


# ---- torch's private attributes, assigned as torch's tests assign them ----------------------


@pytest.mark.parametrize("cls", [TorchScaler, GradScaler], ids=["torch", "lscore"])
@pytest.mark.parametrize("lazy_init_scale", [True, False])
def test_grad_scaling_state_dict(cls, lazy_init_scale: bool) -> None:
    """torch's test_grad_scaling_state_dict (test/test_cuda.py), on the CPU: a value
    assigned to _init_growth_tracker is overwritten by load_state_dict."""
    s0 = cls("cpu", init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
    s1 = cls("cpu", init_scale=6.0, growth_factor=7.0, backoff_factor=0.8, growth_interval=1)
    s1._init_growth_tracker = 7  # a value for load_state_dict to overwrite
    if lazy_init_scale:
        s1.scale(torch.full((1,), 4.0, dtype=torch.float32))
        assert torch.is_floating_point(s1._scale) and s1._scale.device.type == "cpu"
    s1.load_state_dict(s0.state_dict())
    assert s1.get_scale() == 3.0
    assert s1.get_growth_factor() == 4.0
    assert s1.get_backoff_factor() == 0.5
    assert s1.get_growth_interval() == 2
    assert s1._init_growth_tracker == 0


def _first_steps(cls, **assign) -> list:
    """Assign torch's private attributes before the first scale(), then step: the scales,
    trackers and the attributes read back."""
    s = cls("cpu", init_scale=4.0, growth_interval=3)
    for name, value in assign.items():
        setattr(s, name, value)
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.0)
    seen = []
    for _ in range(3):
        opt.zero_grad()
        s.scale(w.sum()).backward()
        s.step(opt)
        s.update()
        seen.append((s.get_scale(), int(s._growth_tracker), s._init_scale, s._init_growth_tracker))
    return seen


@pytest.mark.parametrize(
    "assign",
    [
        {"_init_growth_tracker": 2},
        {"_init_scale": 16.0},
        {"_init_scale": 8.0, "_init_growth_tracker": 1},
    ],
)
def test_init_values_assigned_before_the_first_scale_start_the_tensors(assign: dict) -> None:
    """In torch the first scale() creates the scale and growth tracker from _init_scale and
    _init_growth_tracker, so assigning them first sets where the scaler starts."""
    assert _first_steps(GradScaler, **assign) == _first_steps(TorchScaler, **assign)


def test_pytorch_details_page_examples_run() -> None:
    """The examples of the page the class docstring points to (docs/guides/pytorch-details.md)
    give the output shown."""
    from helpers import ROOT

    page = ROOT / "docs" / "guides" / "pytorch-details.md"
    if not page.exists():
        pytest.skip("docs/ is not part of this copy (an sdist)")
    text = re.sub(r"^```.*$", "", page.read_text(), flags=re.M)  # the fences, as blank lines
    test = doctest.DocTestParser().get_doctest(text, {}, page.name, str(page), 0)
    assert len(test.examples) > 10
    assert doctest.DocTestRunner().run(test).failed == 0
