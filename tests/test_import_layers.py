"""The house's import rule: no import cycles, and every import points down the declared layers.

Imports are read from the source (ast), as a reader sees them: those inside functions count (a
lazy import hides a cycle from Python, not from a reader), those under `if TYPE_CHECKING:` do
not (annotations only). Importing `a.b.c` from outside package `a.b` also runs `a.b`'s
`__init__`, so it is an edge to that package too; from inside it, the package is already
loading. A module may import its own layer and the layers below it, never one above.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

from minillm import MOVED

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A module's layer is the first whose patterns match its dotted name.
LAYERS: list[tuple[str, list[str]]] = [
    ("calculators: the config, shapes, datasheets, the device's rules, the cost models", [
        # minillm.spec and minillm.quant: their __init__s are namespaces that import nothing
        "minillm.config", "minillm.spec", "minillm.spec.config", "minillm.quant",
        "minillm.calc", "minillm.calc.*", "minillm.model_config", "minillm.device",
        "minillm.spec.cost", "minillm.quant.schemes", "minillm.attention.io_cost",
        "minillm.attention.online_softmax", "minillm.attention.tiles"]),
    ("workloads: request streams", ["minillm.workloads", "minillm.workloads.*"]),
    ("engine core: requests to LLM, attention, quant, speculative decoding", [
        "minillm.request", "minillm.input_processor", "minillm.sampling", "minillm.sampling.*",
        "minillm.metrics",
        "minillm.trace", "minillm.tokenizer", "minillm.kv_cache", "minillm.prefix_cache",
        "minillm.prefix_cache.*",
        "minillm.waiting_queue", "minillm.scheduler", "minillm.swap", "minillm.batch",
        "minillm.layers", "minillm.layers.*", "minillm.model", "minillm.cuda_graph",
        "minillm.host_allocator", "minillm.model_runner", "minillm.step_loop", "minillm.engine",
        "minillm.llm",
        "minillm.quality", "minillm.attention", "minillm.attention.*", "minillm.quant.*",
        "minillm.spec.*"]),
    ("simulator and fleet: the scheduler on a virtual clock", ["minillm.sim", "minillm.sim.*"]),
    ("serving: the engine run on workloads in real time", ["minillm.serve", "minillm.serve.*"]),
    ("deployment planning: recipe, disaggregation, failure modes, diagnosis, calibration", [
        "minillm.plan", "minillm.plan.*"]),
    ("the public API", ["minillm"]),
    ("what readers run: widgets, labs, benchmarks, training, the CLI", [
        "widgets", "widgets.*", "minillm.labs", "minillm.labs.*", "minillm.bench",
        "minillm.bench.*", "minillm.train", "minillm.train.*", "minillm.cli", "minillm.peers",
        "minillm.peers.*"]),
]


def module_sources(root: Path = ROOT) -> dict[str, str]:
    """Dotted module name -> source, for every module of minillm/ and widgets/."""
    sources = {}
    for path in sorted([*(root / "minillm").rglob("*.py"), *(root / "widgets").rglob("*.py")]):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        sources[name + ("/" if is_package else "")] = path.read_text()
    return sources


def _imports(tree: ast.AST, package: str) -> list[tuple[str, str | None]]:
    """Each import in tree as (module, name): `import m` is (m, None), `from m import x` is
    (m, x), relative ones resolved from package; `if TYPE_CHECKING:` bodies skipped."""
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found.extend((base, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _home(module: str, attribute: str | None) -> tuple[str, str | None]:
    """An import by a short name (minillm.roofline, or `from minillm import roofline`) as the
    import of the module's home (minillm.calc.roofline): the same module object."""
    parts = module.split(".")
    if parts[0] == "minillm" and len(parts) > 1 and parts[1] in MOVED:
        return ".".join(["minillm", MOVED[parts[1]], *parts[2:]]), attribute
    if module == "minillm" and attribute in MOVED:
        package, _, leaf = MOVED[attribute].rpartition(".")
        return f"minillm.{package}", leaf
    return module, attribute


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules and package __init__s its imports run (within minillm, widgets)."""
    modules = {name.rstrip("/") for name in sources}
    graph: dict[str, set[str]] = {}
    for key, source in sources.items():
        name = key.rstrip("/")
        package = name if key.endswith("/") else name.rpartition(".")[0]
        targets: set[str] = set()
        for module, attribute in _imports(ast.parse(source), package):
            module, attribute = _home(module, attribute)
            # `from m import x` imports the submodule m.x where there is one, else reads m
            target = f"{module}.{attribute}" if f"{module}.{attribute}" in modules else module
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:  # `import os.path`, `import m.f`
                parts.pop()
            if not parts:
                continue
            targets.add(".".join(parts))
            for i in range(1, len(parts)):  # the packages above it whose __init__ runs
                above = ".".join(parts[:i])
                if above in modules and not (package == above or package.startswith(above + ".")):
                    targets.add(above)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def layer_of(module: str) -> int | None:
    for level, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return level
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a higher layer, as 'a (layer) -> b (layer)'."""
    found = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                found.append(f"{a} ({LAYERS[la][0].split(':')[0]}) -> "
                             f"{b} ({LAYERS[lb][0].split(':')[0]})")
    return found


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return module_sources()


def test_every_module_has_a_layer(sources) -> None:
    unplaced = [name for name in import_graph(sources) if layer_of(name) is None]
    assert not unplaced, f"add these modules to a layer of LAYERS: {unplaced}"


def test_there_are_no_import_cycles(sources) -> None:
    assert cycles(import_graph(sources)) == []


def test_every_import_points_down_the_layers(sources) -> None:
    assert upward_imports(import_graph(sources)) == []


def test_the_house_imports_each_module_from_its_home(sources) -> None:
    """Short names are for chapters, labs and readers; inside minillm/ and widgets/ an import
    says where the file is, so a reader can follow it."""
    short = []
    for key, source in sources.items():
        name = key.rstrip("/")
        package = name if key.endswith("/") else name.rpartition(".")[0]
        for module, attribute in _imports(ast.parse(source), package):
            if _home(module, attribute) != (module, attribute):
                short.append(f"{name}: {module} {attribute or ''}".strip())
    assert short == []


def test_each_short_name_is_its_home_module() -> None:
    import importlib

    for short, home in MOVED.items():
        module = importlib.import_module(f"minillm.{short}")
        assert module is importlib.import_module(f"minillm.{home}")
        assert module.__spec__.name == f"minillm.{home}"  # reload() and pickling see its home
        assert (ROOT / "minillm" / (home.replace(".", "/") + ".py")).is_file()


def test_the_checks_catch_an_added_cycle_and_an_upward_import(sources) -> None:
    """The rules bite: a calculator that imports the engine is an upward import, and the engine
    core importing the simulator from inside a function closes a cycle."""
    changed = dict(sources)
    changed["minillm.calc.roofline"] += "\n\ndef f():\n    from minillm.llm import LLM\n"
    assert "minillm.calc.roofline (calculators) -> minillm.llm (engine core)" in upward_imports(
        import_graph(changed))
    changed = dict(sources)
    changed["minillm.scheduler"] += "\n\ndef f():\n    from minillm.sim.simulator import simulate\n"
    assert any({"minillm.scheduler", "minillm.sim.simulator"} <= set(c)
               for c in cycles(import_graph(changed)))
    short = dict(sources)  # a short name is followed to its home, so it is caught too
    short["minillm.calc.sizing"] += "\n\ndef f():\n    from minillm import workload\n"
    assert ("minillm.calc.sizing (calculators) -> minillm.workloads.streams (workloads)"
            in upward_imports(import_graph(short)))
    typed = dict(sources)  # annotations only: allowed
    typed["minillm.calc.roofline"] += "\nif TYPE_CHECKING:\n    from minillm.llm import LLM\n"
    assert upward_imports(import_graph(typed)) == upward_imports(import_graph(sources))


def test_a_package_init_runs_for_an_importer_outside_it() -> None:
    graph = import_graph({"pkg/": "", "pkg.a": "from pkg.b import x\n", "pkg.b": "",
                          "other": "import pkg.a\n", "pkg.sub/": "from pkg.sub.c import y\n",
                          "pkg.sub.c": "from .. import b\n"})
    assert graph["other"] == {"pkg", "pkg.a"}
    assert graph["pkg.a"] == {"pkg.b"}  # inside pkg: its __init__ is already loading
    assert graph["pkg.sub.c"] == {"pkg.b"}
    assert graph["pkg.sub"] == {"pkg.sub.c"}
