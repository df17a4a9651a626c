"""Every ```python block of the README and of the documentation's pages runs (so they cannot
rot), and the pages link only to what exists.

``.ci/test_wheel`` runs the same blocks against the built wheel in a fresh venv
(``python tests/test_readme.py`` outside pytest).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


CASES = [(p, i, code) for p in PAGES for i, code in enumerate(blocks(p))]


def run_block(page: Path, code: str) -> None:
    exec(compile(code, str(page), "exec"), {"__name__": "__readme__"})


def test_pages_have_examples() -> None:
    assert len(blocks(ROOT / "README.md")) >= 1
    assert len(CASES) >= 8


def test_readme_is_a_front_door() -> None:
    """The README stays short: the detail lives in docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_relative_links_exist() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def pytest_generate_tests(metafunc):  # noqa: ANN001, ANN201
    if "case" in metafunc.fixturenames:
        metafunc.parametrize(
            "case", CASES, ids=[f"{p.stem}-block{i}" for p, i, _ in CASES]
        )


def test_block_runs(case) -> None:  # noqa: ANN001
    page, _, code = case
    run_block(page, code)


if __name__ == "__main__":  # every block, against whatever llmkernels is importable
    for page, i, code in CASES:
        print(f"{page.relative_to(ROOT)} block {i}", flush=True)
        run_block(page, code)
    print(f"{len(CASES)} blocks ran")
    sys.exit(0)
