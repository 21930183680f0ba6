"""Build-time pieces of the lscore docs.

- ``_static/scale-path.png``: the path of a dynamic loss scale through a run
  with overflows, drawn from lscore's own state machine (``lscore.preset``), so
  the picture is what the code does.
- Signatures of the compiled modules (``lscore._ext``) come from their ``.pyi``
  stubs, which Cython objects lack at run time, and so do the types of their
  classes' attributes.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

#: steps at which the drawn run overflows (two overflows in a row at 70 and 71)
OVERFLOWS = (22, 70, 71, 130)


def scale_path(steps: int = 160) -> tuple[list[float], list[int]]:
    """The scale before each step of a torch-preset run, and the skipped steps."""
    import lscore

    ls = lscore.preset("torch", init_scale=2.0**10, growth_interval=20)
    scales, skipped = [], []
    for step in range(steps):
        scales.append(ls())
        _, applied = ls.update([float("inf") if step in OVERFLOWS else 1.0])
        if not applied:
            skipped.append(step)
    return scales, skipped


def draw_scale_path(app: Sphinx) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales, skipped = scale_path()
    fig, ax = plt.subplots(figsize=(7, 3), dpi=110)
    ax.step(range(len(scales)), scales, where="post", color="C0", label="loss scale")
    ax.scatter(skipped, [scales[s] for s in skipped], color="C3", zorder=3, label="skipped step")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("scale")
    ax.set_title("torch preset: init_scale=1024, growth_interval=20")
    ax.legend(loc="upper left")
    fig.tight_layout()
    out = Path(app.srcdir) / "_static" / "scale-path.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


@cache
def _stub_signatures(module: str) -> dict[str, str]:
    """``name`` / ``Class.method`` -> ``(args) -> ret``, and ``Class.attribute`` -> its
    type, from the module's ``.pyi``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return {}
    stub = Path(spec.origin).parent / (module.rsplit(".", 1)[-1] + ".pyi")
    if not stub.exists():
        return {}
    out: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = ast.unparse(node.args)
                ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
                out[prefix + node.name] = f"({args}){ret}"
            elif isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[prefix + node.target.id] = ast.unparse(node.annotation)

    visit(ast.parse(stub.read_text()).body, "")
    return out


def _stub_for(obj: Any, what: str, name: str) -> tuple[str, str] | None:
    """(args, returns) of a compiled object from its module's ``.pyi``, or None."""
    module = getattr(obj, "__module__", None) or ""
    if not module.startswith("lscore._ext."):
        return None
    qualname = getattr(obj, "__qualname__", name.rsplit(".", 1)[-1])
    sigs = _stub_signatures(module)
    found = sigs.get(f"{qualname}.__init__" if what == "class" else qualname)
    if found is None:
        return None
    args, _, returns = found.partition(" -> ")
    if what in ("class", "method"):
        args = args.replace("(self, ", "(", 1).replace("(self)", "()", 1)
    if what == "class" or returns == "None":
        returns = ""
    return args, returns


def stub_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    ret: str | None,
) -> tuple[str, str | None] | None:
    """A compiled function's or method's signature, from the stub."""
    if signature is None:  # nothing introspected: Sphinx takes no replacement then
        return None
    stub = _stub_for(obj, what, name)
    return None if stub is None else (stub[0], stub[1] or None)


def stub_class_signature(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A compiled class has no introspectable signature: state the stub's in its text."""
    if what != "class":
        return
    stub = _stub_for(obj, what, name)
    if stub is not None:
        lines[:0] = [f"``{name.rsplit('.', 1)[-1]}{stub[0]}``", ""]


def stub_attribute_type(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A compiled class's attribute has no type and no docstring: state the stub's type
    as its text (before numpydoc reads the docstring)."""
    owner = getattr(obj, "__objclass__", None)  # a getset or member descriptor's class
    module = getattr(owner, "__module__", None) or ""
    if what != "attribute" or not module.startswith("lscore._ext.") or any(lines):
        return
    found = _stub_signatures(module).get(f"{owner.__qualname__}.{obj.__name__}")
    if found is not None:
        lines[:] = [f"``{found}``"]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", draw_scale_path)
    app.connect("autodoc-process-signature", stub_signature)
    app.connect("autodoc-process-docstring", stub_class_signature)
    # before numpydoc's handler (priority 500), which marks even an empty docstring
    app.connect("autodoc-process-docstring", stub_attribute_type, priority=400)
    return {"parallel_read_safe": True}
