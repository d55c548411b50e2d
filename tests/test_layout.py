"""The layout of ``src/maskrl`` (docs/architecture.md, "Validate at the seam" / "Keep functions small"), checked
on the source with :mod:`ast`, the way verl checks its own structure:

* every module has at most :data:`MAX_MODULE_LINES` lines (the code sandbox aside: its parent and
  child halves are one security boundary, kept whole);
* every function (methods and nested functions included, docstring included) has at most
  :data:`MAX_FUNCTION_LINES` lines, except the few named in :data:`LONG_FUNCTIONS`, none of them over
  :data:`MAX_EXCEPTION_LINES`;
* the modules import each other without a cycle; an import inside a function counts (it runs as
  soon as the function does), one under ``if TYPE_CHECKING:`` does not (it never runs), and neither
  does a package ``__init__``'s import of its own submodules (what registers the built-ins and
  re-exports the public names);
* a credit-module class (a class defined in ``maskrl/credit/<module>.py``) is used in no other source
  file than its own (the package ``__init__``'s registration and re-export aside): the trainer, the
  planner and the config reach modules through the registry and the ``CreditModule`` hooks.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "maskrl"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_EXCEPTION_LINES = 150

#: modules exempt from the line limit: the code sandbox (parent and child)
LONG_MODULES_ALLOWED = {"maskrl/sandbox.py", "maskrl/_sandbox_child.py"}

#: functions allowed past MAX_FUNCTION_LINES (``module path:qualified name`` -> why); each at most
#: MAX_EXCEPTION_LINES
LONG_FUNCTIONS: dict[str, str] = {}

# TEMPORARY: modules and functions being split on other branches right now (the sampler as a package,
# the trainer <= 600 lines, the evaluation harness's run_harness). Shrink these lists as those branches
# land: an entry that no longer exists or is back within the limit fails
# :func:`test_temporary_lists_are_current`, so a stale entry is noticed. Nothing may be added here, and an
# entry leaves it for good (a function may move to LONG_FUNCTIONS only once it is <= MAX_EXCEPTION_LINES).
TEMPORARY_LONG_MODULES: set[str] = set()
TEMPORARY_LONG_FUNCTIONS: set[str] = set()


def _sources() -> dict[str, Path]:
    """``{"maskrl/x/y.py": path}`` of every module under src/maskrl."""
    return {p.relative_to(SRC).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def _module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(rel: str) -> bool:
    return rel.endswith("/__init__.py")


def _functions(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function, methods and nested functions included."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _lines(node: ast.AST) -> int:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - first + 1


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """``(imported module, names taken from it)`` of every import that can run (function bodies
    included, ``if TYPE_CHECKING:`` blocks not); relative imports resolved against ``module``."""
    out = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit_one(sub)
                continue
            visit_one(child)

    def visit_one(child):
        if isinstance(child, ast.Import):
            out.extend((a.name, []) for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (child.level - 1)]
                base = ".".join(pkg + ([child.module] if child.module else []))
            out.append((base, [a.name for a in child.names]))
        visit(child)

    visit(tree)
    return out


def import_graph(texts: dict[str, str]) -> dict[str, set[str]]:
    """``module -> modules of maskrl it imports`` of the sources ``texts`` (``{"maskrl/x/y.py": source}``;
    see the module docstring for what counts).

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; ``import a.b``
    an edge to ``a.b``. A package ``__init__``'s imports of its own submodules are left out."""
    modules = {_module_name(rel): rel for rel in texts}
    graph: dict[str, set[str]] = {}
    for name, rel in modules.items():
        edges = set()
        for target, names in _imports(ast.parse(texts[rel]), name, _is_package(rel)):
            if not (target == "maskrl" or target.startswith("maskrl.")):
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges.update(subs)
            if len(subs) < max(1, len(names)):  # names taken from the module (package) itself
                edges.add(target)
        edges = {t for t in edges if t in modules and t != name}
        if _is_package(rel):
            edges = {t for t in edges if not t.startswith(name + ".")}
        graph[name] = edges
    return graph


def _texts() -> dict[str, str]:
    return {rel: p.read_text(encoding="utf-8") for rel, p in _sources().items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:  # a shortest path back to the component's first module, for the message
        members, start = set(comp), sorted(comp)[0]
        paths, seen, found = [[start]], {start}, None
        while paths and found is None:
            nxt = []
            for path in paths:
                for w in sorted(graph[path[-1]] & members):
                    if w == start:
                        found = path + [start]
                        break
                    if w not in seen:
                        seen.add(w)
                        nxt.append(path + [w])
                if found:
                    break
            paths = nxt
        cycles.append(found)
    return cycles


# ----------------------------------------------------------------------------------------------
# the checks of the checker (each rule fails on a small made-up case)
# ----------------------------------------------------------------------------------------------
def test_checker_finds_cycles_and_lazy_imports():
    texts = {"maskrl/__init__.py": "", "maskrl/a.py": "def f():\n    from maskrl.b import x\n",
             "maskrl/b.py": "import maskrl.c\n", "maskrl/c.py": "from maskrl import a\n",
             "maskrl/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from maskrl.a import y\n",
             "maskrl/reg/__init__.py": "from maskrl.reg.one import One\nfrom maskrl import e\n",
             "maskrl/reg/one.py": "from maskrl.reg import base\n", "maskrl/reg/base.py": "",
             "maskrl/e.py": "from maskrl.reg import REGISTRY\n"}
    graph = import_graph(texts)
    assert graph["maskrl.a"] == {"maskrl.b"}  # the lazy import counts
    assert graph["maskrl.c"] == {"maskrl.a"}  # `from maskrl import a`: the module maskrl.a
    assert graph["maskrl.d"] == set()  # TYPE_CHECKING does not
    assert graph["maskrl.reg"] == {"maskrl.e"}  # registration imports of its own submodules do not
    assert graph["maskrl.reg.one"] == {"maskrl.reg.base"}
    assert find_cycles(graph) == [["maskrl.a", "maskrl.b", "maskrl.c", "maskrl.a"],
                                  ["maskrl.e", "maskrl.reg", "maskrl.e"]]
    assert find_cycles({"x": {"y"}, "y": set()}) == []


def test_checker_resolves_relative_imports_and_counts_lines():
    tree = ast.parse("from . import base\nfrom ..models import adapter\n")
    assert _imports(tree, "maskrl.credit.dps", False) == [("maskrl.credit", ["base"]), ("maskrl.models", ["adapter"])]
    assert _imports(tree, "maskrl.credit", True) == [("maskrl.credit", ["base"]), ("maskrl.models", ["adapter"])]
    fn = ast.parse("class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n        return 1\n")
    found = {name: _lines(node) for name, node in _functions(fn)}
    assert found == {"A.f": 5, "A.f.g": 2}


# ----------------------------------------------------------------------------------------------
# the layout
# ----------------------------------------------------------------------------------------------
def test_modules_are_short():
    long = {rel: len(p.read_text(encoding="utf-8").splitlines()) for rel, p in _sources().items()}
    over = {rel: n for rel, n in long.items() if n > MAX_MODULE_LINES
            and rel not in LONG_MODULES_ALLOWED | TEMPORARY_LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them along their seams): {over}"


def _all_functions() -> dict[str, int]:
    out = {}
    for rel, p in _sources().items():
        for name, node in _functions(ast.parse(p.read_text(encoding="utf-8"))):
            out[f"{rel}:{name}"] = _lines(node)
    return out


def test_functions_are_short():
    lengths = _all_functions()
    over = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES
            and k not in LONG_FUNCTIONS and k not in TEMPORARY_LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (name the stages as functions): {over}"
    too_long = {k: lengths[k] for k in LONG_FUNCTIONS if lengths.get(k, 0) > MAX_EXCEPTION_LINES}
    assert not too_long, f"named exceptions over {MAX_EXCEPTION_LINES} lines: {too_long}"
    assert len(LONG_FUNCTIONS) <= 5, "the exception list is meant to stay short"


def test_temporary_lists_are_current():
    """Every TEMPORARY entry still exists and is still over its limit; once a branch splits it, the
    entry goes (this test says which)."""
    sources = _sources()
    lengths = _all_functions()
    stale = [m for m in TEMPORARY_LONG_MODULES
             if m not in sources or len(sources[m].read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES]
    stale += [f for f in TEMPORARY_LONG_FUNCTIONS if lengths.get(f, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"remove from the TEMPORARY lists of tests/test_layout.py (split or gone now): {sorted(stale)}"
    named = [f for f in LONG_FUNCTIONS if f not in lengths or lengths[f] <= MAX_FUNCTION_LINES]
    assert not named, f"remove from LONG_FUNCTIONS (gone or short now): {named}"


def test_no_import_cycles():
    cycles = find_cycles(import_graph(_texts()))
    assert not cycles, "import cycles (lazy imports count): " + "; ".join(" -> ".join(c) for c in cycles)


def credit_classes(texts: dict[str, str]) -> dict[str, str]:
    """``class name -> file`` of the classes defined in ``maskrl/credit/<module>.py`` (``texts``:
    ``{"maskrl/...py": source}``; the package ``__init__`` and ``base.py`` define the seam, no module)."""
    owners = {}
    for rel, text in texts.items():
        if rel.startswith("maskrl/credit/") and rel.count("/") == 2 and \
                rel.rsplit("/", 1)[1] not in ("__init__.py", "base.py"):
            for node in ast.parse(text).body:
                if isinstance(node, ast.ClassDef):
                    owners[node.name] = rel
    return owners


def credit_class_uses(texts: dict[str, str]) -> list[str]:
    """Where a credit-module class is imported or named outside its own file (the credit package's
    ``__init__`` aside: registration and re-export)."""
    owners = credit_classes(texts)
    uses = []
    for rel, text in texts.items():
        if rel == "maskrl/credit/__init__.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                uses += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names
                         if a.name in owners and owners[a.name] != rel]
                continue
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in owners and owners[name] != rel:
                uses.append(f"{rel}:{node.lineno} uses {name}")
    return uses


def test_credit_module_classes_stay_in_their_files():
    texts = _texts()
    assert {"DPS", "DiSPO", "DTCA", "RLDFSteps"} <= set(credit_classes(texts))
    uses = credit_class_uses(texts)
    assert not uses, ("credit-module classes used outside their own files (ask the module through a "
                      "CreditModule hook instead): " + "; ".join(uses))


def test_credit_rule_catches_a_planner_special_case():
    """The planner's old ``isinstance(m, DiSPO)`` (imported lazily) is caught; the class's own file,
    the package's registration and a mere mention in a docstring are not."""
    texts = {"maskrl/credit/dispo.py": "class DiSPO:\n    def f(self):\n        return DiSPO\n",
             "maskrl/credit/__init__.py": "from maskrl.credit.dispo import DiSPO\n",
             "maskrl/plan.py": '"""DiSPO keeps every state."""\n\ndef rows(m):\n'
                               '    from maskrl.credit.dispo import DiSPO\n    return isinstance(m, DiSPO)\n',
             "maskrl/trainer.py": "import maskrl.credit.dispo as d\n\ndef g():\n    return d.DiSPO\n"}
    assert credit_class_uses(texts) == ["maskrl/plan.py:4 imports DiSPO", "maskrl/plan.py:5 uses DiSPO",
                                        "maskrl/trainer.py:4 uses DiSPO"]
