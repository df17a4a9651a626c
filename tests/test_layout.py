"""The package's shape, held: no Python file over 800 lines, no import cycle between its
modules, no module importing another's private names, one file per model family."""

from __future__ import annotations

import ast
from pathlib import Path

import llmkernels
import pytest
from llmkernels.families import FAMILIES

PACKAGE = Path(llmkernels.__file__).parent
MAX_LINES = 800


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
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(t) :], t]))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


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
