"""The parts depend only downward (README, "Layout"), read from the imports themselves.

Layers, bottom first; a module may import its own part and any part on a lower
layer, never one on its own layer (sideways) or above, and never a name or
module of another part that starts with ``_`` (private):

    core            py_vcuda: native, quantity, ledger reader, nvml, sim, procfs, memory_reconciler, ...
    contract        kube_contract; token_scheduler (a self-contained daemon and its admin client)
    node state      node_state
    parts           device_plugin, dra_driver, scheduler_extender, the py_vcuda commands (vcuda run, top, demo, doctor)
    dispatcher      py_vcuda/cli.py, the only file that knows them all

A new top-level package, or a new py_vcuda module, must be given a place here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PY_VCUDA_CORE = {"__init__", "_native", "native", "quantity", "ledger", "nvml", "sim", "gpu", "probe", "procfs",
                 "memory_reconciler", "environ", "files", "quota_file"}
PY_VCUDA_COMMANDS = {"launch", "top", "demo", "doctor", "container_check"}
PY_VCUDA_DISPATCHER = {"cli", "__main__"}

LAYERS: list[set[str]] = [
    {"core"},
    {"kube_contract", "token_scheduler"},
    {"node_state"},
    {"device_plugin", "dra_driver", "scheduler_extender", "commands"},
    {"dispatcher"},
]
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    """The part a dotted module name belongs to; None for what is not vcuda's (stdlib, libraries)."""
    top, _, rest = module.partition(".")
    if top != "py_vcuda":
        return top if top in LAYER else None
    first = rest.split(".")[0] or "__init__"
    if first in PY_VCUDA_COMMANDS:
        return "commands"
    if first in PY_VCUDA_DISPATCHER:
        return "dispatcher"
    if first in PY_VCUDA_CORE or not (REPO / "py_vcuda" / f"{first}.py").exists():
        return "core"   # a core module, or a name defined in py_vcuda/__init__.py (__version__)
    raise AssertionError(f"py_vcuda.{first} has no layer: add it to tests/test_layering.py")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imported(module: str, tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import in the tree, function-local ones included."""
    package = module.split(".")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target, [alias.name for alias in node.names]))
    return found


def violations(module: str, source: str) -> list[str]:
    """What in `source` (the text of `module`) breaks the layering."""
    own = part_of(module)
    assert own is not None, module
    found = []
    for line, target, names in imported(module, ast.parse(source)):
        # `from py_vcuda import launch` imports a module whose part is not the package's
        targets = [f"{target}.{n}" for n in names] if target == "py_vcuda" else [target]
        for other in dict.fromkeys(part_of(t) for t in targets):
            if other is None or other == own:
                continue
            where = f"{module}:{line} imports {target}"
            if LAYER[other] >= LAYER[own]:
                found.append(f"{where}: {other} is {'beside' if LAYER[other] == LAYER[own] else 'above'} {own}")
            private = [p for p in target.split(".") if is_private(p)] + [n for n in names if is_private(n)]
            if private:
                found.append(f"{where}: private {', '.join(private)} of {other}")
    return found


def packages() -> list[Path]:
    return sorted(p.parent for p in REPO.glob("*/__init__.py"))


def modules() -> list[tuple[str, Path]]:
    found = []
    for package in packages():
        for path in sorted(package.rglob("*.py")):
            # a package keeps its __init__ part, so its relative imports resolve from the package itself
            found.append((".".join(path.relative_to(REPO).with_suffix("").parts), path))
    return found


def test_every_package_has_a_layer() -> None:
    names = {p.name for p in packages()}
    assert {"py_vcuda", "kube_contract", "node_state", "device_plugin"} <= names  # the walk finds them
    unplaced = sorted(names - set(LAYER) - {"py_vcuda"})
    assert not unplaced, f"packages without a layer (add them to tests/test_layering.py): {unplaced}"


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_imports_only_downward(module: str, path: Path) -> None:
    assert violations(module, path.read_text()) == []


@pytest.mark.parametrize("module,source,expected", [
    ("node_state.layout", "from device_plugin import agent", "above"),
    ("device_plugin.pods", "from scheduler_extender.kube import KubeBinder", "beside"),
    ("py_vcuda.launch", "import device_plugin.layout", "beside"),
    ("py_vcuda.ledger", "from node_state.layout import NodeLayout", "above"),
    ("kube_contract.names", "from token_scheduler.wire import VERSION", "beside"),
    ("device_plugin.pods", "from kube_contract.apiclient import _read", "private _read"),
    ("device_plugin.agent", "from py_vcuda._native import lib", "private _native"),
    ("scheduler_extender.state", "from .placement import place", None),
    ("node_state.schedulers", "from token_scheduler.admin_client import AdminClient", None),
    ("py_vcuda.cli", "from device_plugin import cli", None),
    ("py_vcuda.cli", "from py_vcuda import __version__", None),
    ("py_vcuda.demo", "from py_vcuda import launch, native", None),
    ("py_vcuda.nvml", "from py_vcuda import launch", "above"),
    ("token_scheduler.__init__", "from .policy import Policy", None),
    ("py_vcuda.nvml", "from .launch import Tenant", "above"),
    ("py_vcuda.__init__", "from .top import main", "above"),
])
def test_the_check_catches(module: str, source: str, expected: str | None) -> None:
    found = violations(module, source)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found
