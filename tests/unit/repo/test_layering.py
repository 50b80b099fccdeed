"""The library's import layers (CONTRIBUTING.md "Layers"), read from the source with `ast`, nothing imported.

- a package imports only packages of a lower layer (never one of its own rank or higher); `modeling_instella` sits
  below the library (it is also Hub remote code, so it imports nothing of ours) and the CLI in `scripts/`
  (`instella_recipes.scripts`) above it (the library never imports a script);
- no import cycle between packages, nor between modules (an import inside a function counts: it is an arrow all the
  same);
- an import of a project module inside a function says why on its own line or the line above (the one accepted
  reason is an optional or heavy dependency that a module-level import would force on every user).
"""

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = ROOT / "src" / "instella_recipes"
MODEL = ROOT / "modeling_instella"

# Low -> high. The same table is in CONTRIBUTING.md; a new package gets its rank here and there.
LAYERS = {
    "modeling_instella": -1,
    "core": 0,
    "weights": 1,
    "data": 2,
    "sandbox": 2,
    "rewards": 2,
    "trainer": 3,
    "pretraining": 4,
    "post_training": 4,
    "systems": 5,
    "evaluation": 5,
    "checkpoint": 6,
    "synthetic_gsm8k": 6,
    "pipeline": 7,
    "scripts": 8,
}
# Comment text that gives no reason: tool directives.
DIRECTIVE = re.compile(r"noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?|fmt:\s*\w+|pragma:[^#]*")


@dataclass(frozen=True)
class Import:
    where: str  # path:line, relative to the repository
    source: str  # the importing package (a key of LAYERS, or "<root>" for instella_recipes/__init__.py)
    target: str  # the imported package
    module: str  # the imported module, dotted
    in_function: bool
    explained: bool  # a comment on the statement's lines or the line above that says more than a tool directive
    importer: str = ""  # the importing module, dotted


def _package(module: str) -> str | None:
    """The package key of a dotted module name, None for a module outside the project."""
    parts = module.split(".")
    if parts[0] == "modeling_instella":
        return "modeling_instella"
    if parts[0] != "instella_recipes":
        return None
    return parts[1] if len(parts) > 1 else "<root>"


def _module_name(path: Path) -> str:
    if path.is_relative_to(LIBRARY):
        parts = ("instella_recipes", *path.relative_to(LIBRARY).with_suffix("").parts)
    else:
        parts = ("modeling_instella", *path.relative_to(MODEL).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _explained_lines(source: str) -> set[int]:
    """Lines holding a comment that says something besides tool directives (`# noqa: F401` alone says nothing)."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and re.search(r"\w", DIRECTIVE.sub("", token.string.lstrip("#"))):
            lines.add(token.start[0])
    return lines


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The absolute dotted names one import statement reads (relative imports resolved against `module`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module or ""]
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, alias.name]) for alias in node.names]  # `from . import x`: x may be a module


def _function_scoped(tree: ast.Module) -> set[ast.AST]:
    """The import statements that run inside a function (or lambda), at any depth."""
    scoped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scoped.update(n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return scoped


def _file_imports(path: Path) -> list[Import]:
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    module, explained, scoped = _module_name(path), _explained_lines(text), _function_scoped(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        lines = range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)  # the statement and the line above
        for target in _targets(node, module, path.name == "__init__.py"):
            if (package := _package(target)) is not None:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append(
                    Import(
                        where,
                        _package(module),
                        package,
                        target,
                        node in scoped,
                        any(n in explained for n in lines),
                        module,
                    )  # fmt: skip
                )
    return sorted(found, key=lambda i: int(i.where.rsplit(":", 1)[1]))


@cache  # one walk of the sources for every test of the module
def project_imports() -> tuple[Import, ...]:
    """Every import of a project module in the library and the model package, with where it is and how."""
    return tuple(i for path in sorted([*LIBRARY.rglob("*.py"), *MODEL.rglob("*.py")]) for i in _file_imports(path))


def test_the_walk_sees_the_library():
    """Guards the other tests against passing on nothing: the walk finds the library's own arrows."""
    imports = project_imports()
    assert len(imports) > 100
    assert any(i.source == "pipeline" and i.target == "core" for i in imports)


def test_every_package_has_a_layer():
    packages = {p.name for p in LIBRARY.iterdir() if (p / "__init__.py").is_file()}
    unranked = sorted(packages - LAYERS.keys())
    assert not unranked, f"packages without a layer: {unranked} (give each a rank in LAYERS and in CONTRIBUTING.md)"


def test_packages_import_only_lower_layers():
    problems = [
        f"{i.where}: {i.source} (layer {LAYERS[i.source]}) imports {i.module} ({i.target}, layer {LAYERS[i.target]})"
        for i in project_imports()
        if i.source != i.target and i.source in LAYERS and i.target in LAYERS and LAYERS[i.target] >= LAYERS[i.source]
    ]
    assert not problems, "imports that do not go down a layer:\n" + "\n".join(problems)


def test_the_root_package_imports_nothing_of_ours():
    """`import instella_recipes` stays free: the top-level __init__ is a docstring, not a hub of imports."""
    problems = [f"{i.where}: imports {i.module}" for i in project_imports() if i.source == "<root>"]
    assert not problems, "\n".join(problems)


def _cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one package (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(arrows.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            connect(node)
    return components


def test_cycles_are_found():
    """The cycle finder itself, on a graph with one 3-cycle and a tail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_packages():
    imports = [i for i in project_imports() if i.source != i.target]
    arrows: dict[str, set[str]] = {}
    for i in imports:
        arrows.setdefault(i.source, set()).add(i.target)
    problems = []
    for component in _cycles(arrows):
        members = set(component)
        edges = [f"  {i.where}: {i.source} -> {i.target}" for i in imports if {i.source, i.target} <= members]
        problems.append(f"cycle {' <-> '.join(component)}:\n" + "\n".join(edges))
    assert not problems, "\n".join(problems)


def _module_of(target: str, modules: set[str]) -> str | None:
    """The library module an import reads: the module itself, or for `import a.b.name` the nearest module above."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_no_import_cycle_between_modules():
    """Module by module, inside a package too (`core/recipe.py` <-> `core/command_line.py` once hid behind an import
    inside a function): a cycle makes the import order matter and one of its members half-initialised."""
    modules = {i.importer for i in project_imports()} | {
        _module_name(p) for p in [*LIBRARY.rglob("*.py"), *MODEL.rglob("*.py")]
    }
    arrows: dict[str, set[str]] = {}
    edges = []
    for i in project_imports():
        target = _module_of(i.module, modules)
        if target is not None and target != i.importer:
            arrows.setdefault(i.importer, set()).add(target)
            edges.append((i.where, i.importer, target))
    problems = []
    for component in _cycles(arrows):
        members = set(component)
        lines = [f"  {where}: {a} -> {b}" for where, a, b in edges if {a, b} <= members]
        problems.append(f"cycle {' <-> '.join(component)}:\n" + "\n".join(lines))
    assert not problems, "\n".join(problems)


def test_a_tool_directive_alone_is_no_reason():
    source = (
        "import a  # noqa: F401\nimport b  # noqa: F401  (registers the model class)\n# lazy: torch is heavy\nx = 1\n"
    )
    assert _explained_lines(source) == {2, 3}


def test_in_function_imports_of_project_modules_say_why():
    problems = [f"{i.where}: {i.module}" for i in project_imports() if i.in_function and not i.explained]
    assert not problems, (
        "imports of project modules inside a function with no comment saying why (move each to the top of its module, "
        "or say on its line or the line above which optional/heavy dependency keeps it there):\n" + "\n".join(problems)
    )


def test_every_package_is_installed():
    """pyproject's explicit package list names every package, so a non-editable install (a wheel) has them all."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {_module_name(p.parent / "__init__.py") for p in LIBRARY.rglob("__init__.py")}
    assert on_disk <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(on_disk - listed)}"
