"""The packages import downward only: the data layer (``datasets/``) and the environments (``envs/``)
import no ``core``, no ``studies``, no entry script and no ``policies`` (readers and environments
know nothing of models), and ``policies/`` imports none of those nor ``datasets``. Checked on the source with ``ast``, so an import inside a function counts as much as
one at the top of a file."""
import ast

import pytest

from tests.helpers import REPO

ENTRY_SCRIPTS = tuple(sorted(p.stem for p in REPO.glob("*.py")))  # train_policy, rollout, generate_demos, ...
FORBIDDEN = {
    "datasets": ("core", "studies", "probes", "policies", *ENTRY_SCRIPTS),
    "envs": ("core", "studies", "probes", "policies", *ENTRY_SCRIPTS),
    "policies": ("core", "studies", "probes", "datasets", *ENTRY_SCRIPTS),
    "common": ("core", "studies", "probes", "datasets", "policies", "envs", *ENTRY_SCRIPTS),  # the lowest layer
    "studies": ("probes", *ENTRY_SCRIPTS),  # the probes write records through studies.records, never the reverse
}


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, the module named ``module``
    (``datasets.generate``): relative imports resolved against its package, nested ones included."""
    tree = ast.parse(source)
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module:
                found.append((node.lineno, ".".join(base + [node.module])))
            else:  # ``from . import x``: the names are modules of the package
                found += [(node.lineno, ".".join(base + [alias.name])) for alias in node.names]
    return found


def violations(package: str) -> list[str]:
    out = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO)
        module = ".".join(rel.with_suffix("").parts)
        if rel.name == "__init__.py":
            module += ".__init__"  # its relative imports resolve against the package itself
        for line, name in imported_modules(path.read_text(), module):
            if name.split(".")[0] in FORBIDDEN[package]:
                out.append(f"{rel}:{line} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_import_nothing_above_them(package):
    assert ENTRY_SCRIPTS and {"train_policy", "rollout", "generate_demos", "export_dataset"} <= set(ENTRY_SCRIPTS)
    assert violations(package) == []


def test_the_check_sees_imports_at_any_level():
    source = ("import numpy\n"
              "from . import episodes\n"
              "from .factory import read_dataset\n"
              "def f():\n"
              "    from core.config import CONFIG_DIR\n"
              "    import studies.engine as e\n"
              "class C:\n"
              "    def g(self):\n"
              "        from .. import rollout\n")
    found = [name for _, name in imported_modules(source, "datasets.generate")]
    assert found == ["numpy", "datasets.episodes", "datasets.factory", "core.config", "studies.engine", "rollout"]
    assert [name for _, name in imported_modules("from .attention import X\n", "policies.vision.masks")] == [
        "policies.vision.attention"]


def import_graph(packages=("core", "datasets", "envs", "policies", "studies", "probes")) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any level; ``from pkg.mod import name`` counts as pkg.mod)."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in packages for p in (REPO / pkg).rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        own = module + ".__init__" if path.name == "__init__.py" else module
        names = [name for _, name in imported_modules(path.read_text(), own)]
        # the longest prefix of each name that is one of our modules (from a.b import c: a.b, or a.b.c if a module)
        graph[module] = {next(n for n in (".".join(name.split(".")[:i]) for i in range(name.count(".") + 1, 0, -1))
                              if n in paths) for name in names if name.split(".")[0] in packages} - {module}
    return graph


def test_no_import_circles():
    from graphlib import CycleError, TopologicalSorter

    graph = import_graph()
    assert {"datasets.factory", "policies.vision.attention", "core.training"} <= set(graph)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")
    graph["datasets.episodes"].add("datasets.factory")  # a circle the check must see: factory imports episodes
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()
