"""The package's shape, held: no Python file over 800 lines, no import cycle between its
modules, no module importing another's private names, one file per model family; in cpp/, no
include cycle and no two headers of one name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import llmkernels
import pytest
from llmkernels.families import FAMILIES

PACKAGE = Path(llmkernels.__file__).parent
MAX_LINES = 800
CPP = Path(__file__).resolve().parent.parent / "cpp"


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        out[name] = f
    return out


def _runtime_imports(name: str, f: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, imported name) of every relative import of ``f`` that runs (the ones under
    ``if TYPE_CHECKING:`` are annotations only), lazy ones inside functions included."""
    tree = ast.parse(f.read_text(encoding="utf-8"))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for n in ast.walk(node)}
    package = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            if f"{target}.{alias.name}" in modules:
                found.append((f"{target}.{alias.name}", ""))  # a submodule
            elif alias.name != "_core":  # the extension, not a Python module
                found.append((target, alias.name))
    return found


def _assert_acyclic(graph: dict[str, set[str]], what: str) -> None:
    """Fail with the first cycle a depth-first search of ``graph`` (node -> the nodes it points
    to) meets, as ``what: a -> b -> a``."""
    state: dict[str, int] = {}  # 1: on the path being searched, 2: done

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                pytest.fail(f"{what}: " + " -> ".join([*path[path.index(t) :], t]))
            if t not in state:
                visit(t, [*path, t])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_no_python_file_over_800_lines() -> None:
    long = {
        str(f.relative_to(PACKAGE)): n
        for f in _modules().values()
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {
        m: {t for t, _ in _runtime_imports(m, f, modules) if t in modules}
        for m, f in modules.items()
    }
    # a package's __init__ importing its submodules (which import siblings through it) is how
    # Python packages work; the cycles that matter are between modules
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t == "llmkernels" or m.startswith(t + "."))}
    _assert_acyclic(graph, "import cycle")


def test_no_module_imports_another_modules_private_names() -> None:
    modules = _modules()
    private = [
        f"{m} imports {name} from {target}"
        for m, f in modules.items()
        for target, name in _runtime_imports(m, f, modules)
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not private, private


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_each_family_is_one_file(model_type: str) -> None:
    family = FAMILIES[model_type]
    module = type(family).__module__
    assert module == f"llmkernels.families.{model_type}", module
    assert (PACKAGE / "families" / f"{model_type}.py").is_file()


def _cpp_files() -> list[Path]:
    if not CPP.is_dir():  # an installed wheel without the sources
        pytest.skip("cpp/ not found next to tests/")
    return sorted(f for f in CPP.rglob("*") if f.suffix in {".hpp", ".cpp", ".in"})


def test_no_two_cpp_headers_share_a_name() -> None:
    names: dict[str, list[str]] = {}
    for f in _cpp_files():
        if f.suffix == ".hpp":
            names.setdefault(f.name, []).append(str(f.relative_to(CPP)))
    shared = {n: paths for n, paths in names.items() if len(paths) > 1}
    assert not shared, shared


def test_no_cpp_include_cycle() -> None:
    """The graph of `#include "..."` lines under cpp/, a .cpp and its .hpp one node (so two .cpp
    files that include each other's headers are a cycle too), is acyclic."""
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    graph: dict[str, set[str]] = {}
    for f in _cpp_files():
        node = str(f.relative_to(CPP).with_suffix(""))
        targets = graph.setdefault(node, set())
        for inc in include.findall(f.read_text(encoding="utf-8")):
            assert (CPP / inc).is_file(), f"{f.relative_to(CPP)} includes missing {inc}"
            target = str(Path(inc).with_suffix(""))
            if target != node:
                targets.add(target)
    _assert_acyclic(graph, "include cycle")
