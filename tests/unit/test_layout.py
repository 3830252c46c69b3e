"""The layout import-linter enforces covers everything, and no module needs itself to load: no import
cycle, counting the imports made inside functions at run time (only `if TYPE_CHECKING:` ones aside)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("periscope", "services")


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _top_level() -> set[str]:
    """Every package and module directly under periscope/ and services/."""
    out = set()
    for package in PACKAGES:
        for path in (ROOT / package).iterdir():
            if path.name.startswith(("_", ".")):
                continue
            if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()):
                out.add(f"{package}.{path.stem}")
    return out


def test_the_layers_contract_places_every_top_level_package() -> None:
    layers = [c for c in _contracts() if c["type"] == "layers"]
    assert len(layers) == 1
    layer_lines = layers[0]["layers"]
    assert isinstance(layer_lines, list)
    placed = [m.strip() for line in layer_lines for m in str(line).replace(":", "|").split("|")]
    assert len(placed) == len(set(placed)), "a package placed in two layers"
    assert set(placed) == _top_level()


def test_production_code_is_forbidden_the_development_kit() -> None:
    kit = {"periscope.devkit", "periscope.sim"}
    forbidden = [c for c in _contracts() if c["type"] == "forbidden" and kit <= set(c["forbidden_modules"])]
    assert len(forbidden) == 1
    sources = set(forbidden[0]["source_modules"])  # type: ignore[call-overload]
    covered = {m for m in _top_level() if m in sources or m.split(".")[0] in sources}
    assert covered == _top_level() - kit


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert cycles(edges) == []
