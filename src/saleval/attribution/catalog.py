"""What each saliency method is, read without loading one: no torch, Captum or lime.

A stage that only names methods (score, compare, report, a published file's import)
needs their table names, published names and paper rows, not their code, and importing
the method modules costs a process seconds (torch, transformers, Captum, lime,
scikit-learn). So the metadata each built-in method declares where it registers
(``@register("lime", display="LIME", ...)``, :func:`saleval.attribution.base.register`)
is read from the package's source with :mod:`ast`, as ``saleval-<stage> --help`` reads a
stage's docstring; a method module is imported only when the method is built
(:func:`load`). Methods registered at run time (a plug-in's, or one of a test's) join
them through :data:`REGISTRY`, the one registry of method classes, which lives here so
that reading it imports nothing.

>>> known_methods()["integrated_gradients"].display, published_names()["LIME"]
('Integrated Gradients', 'lime')
"""

from __future__ import annotations

import ast
import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: registry name -> method class, filled as each method's module is imported (its
#: ``@register``); :func:`load` imports a built-in method's module on first use
REGISTRY: dict[str, Any] = {}

#: the ``register`` keywords that say what a method is (:class:`MethodInfo`'s fields)
DECLARED = ("display", "published", "paper_order")


@dataclass(frozen=True)
class MethodInfo:
    """What a method declares where it registers, and the module that registers it."""

    name: str
    module: str
    display: str  # how tables and plots name it (the registry name unless declared)
    published: str | None = None  # its name in the published crowd results (Lu et al. 2024)
    paper_order: int | None = None  # its row in that paper's tables


def _literal(node: ast.expr, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(
            f"{where}: @register's arguments must be literals, so that what the method is "
            "reads without importing it (saleval.attribution.catalog)"
        ) from None


def registrations(path: Path, module: str) -> list[MethodInfo]:
    """The ``@register(...)`` decorations of one module's classes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        for deco in node.decorator_list:
            func = deco.func if isinstance(deco, ast.Call) else None
            named = getattr(func, "id", None) or getattr(func, "attr", None)
            if not isinstance(deco, ast.Call) or named != "register":
                continue
            where = f"{path}:{deco.lineno}"
            name = _literal(deco.args[0], where)
            kw = {k.arg: _literal(k.value, where) for k in deco.keywords if k.arg in DECLARED}
            found.append(MethodInfo(name, module, kw.pop("display", None) or name, **kw))
    return found


@functools.cache
def builtin_methods() -> dict[str, MethodInfo]:
    """The methods this package's modules register, by registry name (read once)."""
    here = Path(__file__).parent
    out: dict[str, MethodInfo] = {}
    for path in sorted(here.glob("*.py")):
        for info in registrations(path, f"{__package__}.{path.stem}"):
            out[info.name] = info
    return out


def info_of(cls: Any) -> MethodInfo:
    """A registered class's metadata (:func:`saleval.attribution.base.register` sets it)."""
    return MethodInfo(
        cls.registry_name, cls.__module__, cls.display_name, cls.published_name, cls.paper_order
    )


def known_methods() -> dict[str, MethodInfo]:
    """Every method known in this process: the package's own, read from its source, and
    every class registered so far (which wins for its name)."""
    return {**builtin_methods(), **{name: info_of(cls) for name, cls in REGISTRY.items()}}


def paper_methods() -> list[str]:
    """The known methods of the paper's tables, in its row order.

    >>> paper_methods()[:2], paper_methods()[-1]
    (['all_attention', 'last_attention'], 'random')
    """
    rows = sorted(
        (m.paper_order, name) for name, m in known_methods().items() if m.paper_order is not None
    )
    return [name for _, name in rows]


def published_names() -> dict[str, str]:
    """Published method name -> registry name, for every method that declares one (in
    the paper's row order).

    >>> published_names()["Integrated_Gradient"]
    'integrated_gradients'
    """
    order = {name: i for i, name in enumerate(paper_methods())}
    named = [(n, m.published) for n, m in known_methods().items() if m.published]
    named.sort(key=lambda pair: (order.get(pair[0], len(order)), pair[0]))
    return {published: name for name, published in named}


def load(name: str) -> Any | None:
    """The class registered as ``name``, its module imported if it is a built-in method
    not loaded yet; None for a name nobody registers."""
    if name not in REGISTRY and name in builtin_methods():
        importlib.import_module(builtin_methods()[name].module)
    return REGISTRY.get(name)


def load_all() -> dict[str, Any]:
    """:data:`REGISTRY` with every built-in method's module imported."""
    for name in builtin_methods():
        load(name)
    return REGISTRY
