"""The shape of the code that CI keeps: short commands, short functions, every layer keeping to
DESIGN.md's rules, every command module reachable, and the one Typer trick still working after
an upgrade. (A cap on the lines of the whole of cli/ is gone: it made a correct new command
fail the suite for the length of the others; each command's body and every function still
have their limits.)"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tinygpt_cli"
COMMAND_BODY = 45  # lines of a Typer command, its docstring not counted
FUNCTION = 90  # lines of any function, its signature and docstring counted

# Still over a limit, each at most this long: the list may only shrink (empty now: the
# training loop and the model card's writer were the last to be split).
OVER: dict[str, int] = {}


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{path.relative_to(PACKAGE)} {node.name}", node


def _is_command(node) -> bool:
    """Decorated with app.command(...)."""
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
               and d.func.attr == "command" for d in node.decorator_list)


def _body_lines(node) -> int:
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def _measure() -> dict[str, int]:
    """name -> its length, for every function over its limit."""
    over = {}
    for name, node in _functions():
        if _is_command(node) and _body_lines(node) > COMMAND_BODY:
            over[name] = _body_lines(node)
        length = node.end_lineno - node.lineno + 1
        if length > FUNCTION:
            over[name] = max(over.get(name, 0), length)
    return over


def test_the_limits_are_measured_on_real_code():
    commands = [n for n, node in _functions() if _is_command(node)]
    assert "cli/texts.py score" in commands and "cli/inspect.py trace_cmd" in commands
    assert len(commands) >= 30  # every command of `tinygpt --help`


def test_commands_are_short_and_no_function_is_long():
    over = _measure()
    grown = {n: (v, OVER.get(n)) for n, v in over.items() if v > OVER.get(n, 0)}
    assert not grown, f"over the limit ({COMMAND_BODY} lines a command body, {FUNCTION} a " \
                      f"function): {grown}"
    done = sorted(set(OVER) - set(over))
    assert not done, f"now within the limits: take them off OVER: {done}"


def test_every_command_module_is_reachable():
    """A module of cli/ that defines commands but is left out of app.COMMANDS would never be
    imported (only the chosen command's module is): every module is imported here, and each
    command it registers must be in the map with its module."""
    from tinygpt_cli import cli
    app_module = importlib.import_module("tinygpt_cli.cli.app")

    for info in pkgutil.iter_modules(cli.__path__):
        importlib.import_module(f"tinygpt_cli.cli.{info.name}")
    defined = {app_module._command_name(c): c.callback.__module__.rsplit(".", 1)[1]
               for c in app_module.app.registered_commands}
    for group in app_module.app.registered_groups:  # `tinygpt sae ...`: a group of commands
        modules = {c.callback.__module__.rsplit(".", 1)[1]
                   for c in group.typer_instance.registered_commands}
        assert len(modules) == 1, (group.name, modules)
        defined[group.name] = modules.pop()
    assert defined == app_module.COMMANDS


# ------------------------------------------------------------------ the layers

# The floors of the package, top to bottom (DESIGN.md, "Where code lives"): the command line
# and the surfaces (the notebook API, MCP, the commands table) are the doors; jobs do the work
# between a command and its analysis (session, passes ahead, shards, cluster, training); then
# the analyses, the renderers, the model and its math (transformer), and files (storage).
# errors.py, escapes.py and words.py stay at the package's top: tiny leaves that every floor
# imports, and that import nothing of the package. What each floor may import, besides itself
# and those three:
MAY_IMPORT = {
    "cli": {"surfaces", "jobs", "analysis", "render", "transformer", "storage"},
    "surfaces": {"cli", "jobs", "analysis", "render", "transformer", "storage"},
    "jobs": {"analysis", "transformer", "storage"},
    "analysis": {"transformer"},
    "render": {"transformer", "storage"},
    "transformer": {"storage"},
    "storage": set(),
}
LEAVES = {"errors", "escapes", "words"}  # at the top level: imported by anyone, importing nothing
# Left at the top for what was installed before the floors: the module each imports alone.
COMPAT = {"entry": "cli.entry"}  # console scripts generated then import main from entry.py

# Imports that break MAY_IMPORT, each "module -> module": none left (issue 47 removed the last:
# analyses take arrays and a Model, their files, caches, sessions and clusters are the jobs').
# The set may only stay empty: a new climb fails, and would have to be argued for here.
CLIMBS: set[str] = set()

# Finer rules inside the floors: (layer, what it never imports, whether through other modules
# too). The command line reaches the model only through sessions and analyses; `render` never
# runs the model: not by importing it, nor by importing what does (a session, the passes made
# ahead); a session never reaches the --each-line batcher; model, trace and ops never reach
# sampling or generation; analyses never the training loop. A layer is a module or a folder.
RULES = [
    ("cli", ("transformer.model", "transformer.trace", "transformer.ops"), False),
    ("analysis", ("jobs.train", "render", "cli"), False),
    ("transformer.model", ("transformer.sampling", "transformer.generate"), True),
    ("transformer.trace", ("transformer.sampling", "transformer.generate"), True),
    ("transformer.ops", ("transformer.sampling", "transformer.generate"), True),
    ("render", ("transformer.model", "jobs.session", "jobs.ahead"), True),
    ("jobs.session", ("jobs.ahead", "cli.batch"), True),
]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(root: Path, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that this file imports, in every form: `import a.b (as m)`,
    `from a import b` (b a module or a name), relative at any level (`from . import x`,
    `from .. import model`, `from ..model import f`), at the top or inside a function, and
    importlib.import_module("..x", __package__) with a literal name. Imports under
    `if TYPE_CHECKING:` are left out (names for annotations import nothing)."""
    lazy = tuple((m, tuple(sorted(_lazy(root, m).items()))) for m in sorted(modules))
    return _imported_from(_module_name(root, path), path.name == "__init__.py",
                          path.read_text(encoding="utf-8"), frozenset(modules), lazy)


@functools.cache  # a copy of the package with one line planted parses that one file again
def _imported_from(name: str, is_init: bool, text: str, modules: frozenset,
                   lazy: tuple) -> set[str]:
    lazy_of = dict((m, dict(table)) for m, table in lazy)
    package = name.split(".") if is_init else name.split(".")[:-1]
    tree = ast.parse(text)
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    found: set[str] = set()

    def add(dotted: str) -> None:  # the module and the packages it is in
        parts = dotted.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))

    def relative(level: int, module: str | None) -> list[str]:
        base = package[: len(package) - level + 1] if level else []
        return [*base, *(module.split(".") if module else [])]

    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            where = ".".join(relative(node.level, node.module))
            add(where)
            for alias in node.names:
                if f"{where}.{alias.name}" in modules:
                    add(f"{where}.{alias.name}")
                elif alias.name in lazy_of.get(where, {}):  # tinygpt_cli.load: api's
                    add(f"{where}.{lazy_of[where][alias.name]}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            target = node.args[0].value
            dots = len(target) - len(target.lstrip("."))
            add(".".join(relative(dots, target[dots:] or None)) if dots else target)
    return frozenset(found & modules)


@functools.cache
def _lazy(root: Path, package: str) -> dict[str, str]:
    """A package's LAZY table (name -> the module of it that defines it, imported when the
    name is first asked for: tinygpt_cli/__init__.py), read from its __init__.py."""
    init = root.parent.joinpath(*package.split("."), "__init__.py")
    if not init.is_file():
        return {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["LAZY"]:
            return ast.literal_eval(node.value)
    return {}


def _floor(module: str) -> str | None:
    """The floor (MAY_IMPORT's key) or leaf a module of the package is on."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def climbs(root: Path, graph: dict[str, set[str]] | None = None) -> set[tuple[str, str]]:
    """(module, module it imports) for every import MAY_IMPORT does not allow: up a floor,
    sideways to a floor not listed, or from a leaf (errors, words) to anything."""
    if graph is None:
        paths = {_module_name(root, p): p for p in root.rglob("*.py")}
        graph = {m: _imported(root, p, set(paths)) - {m} for m, p in paths.items()}
    out = set()
    for m, targets in graph.items():
        here = _floor(m)
        for n in targets:
            if any(t.startswith(n + ".") for t in targets):
                continue  # a package on the way to one of its modules, counted there
            there = _floor(n)
            if there is None or there == here or there in LEAVES and here not in LEAVES:
                continue
            if here in COMPAT and n != f"{root.name}.{COMPAT[here]}":
                out.add((m, n))
            if here in LEAVES or (here in MAY_IMPORT and there not in MAY_IMPORT[here]):
                out.add((m, n))
    return out


def layer_violations(root: Path) -> set[str]:
    """'module -> banned (via a chain)' for every import of the package at `root` that
    breaks one of RULES, and 'module -> module (climbs)' for every one MAY_IMPORT does not
    allow (but those of CLIMBS)."""
    paths = {_module_name(root, p): p for p in root.rglob("*.py")}
    modules = set(paths)
    graph = {m: _imported(root, p, modules) - {m} for m, p in paths.items()}
    top = root.name
    out = {f"{m} -> {n} (climbs)" for m, n in climbs(root, graph)} - \
        {f"{c} (climbs)" for c in CLIMBS}
    for module in sorted(modules):
        for layer, banned, through in RULES:
            if not (module == f"{top}.{layer}" or module.startswith(f"{top}.{layer}.")):
                continue
            # breadth first: the shortest chain to each module reached
            via, todo = {module: None}, [module]
            for m in todo:
                for n in sorted(graph[m]) if (through or m == module) else ():
                    if n not in via:
                        via[n] = m
                        todo.append(n)
            for b in banned:
                for hit in sorted(n for n in via if n != module and (
                        n == f"{top}.{b}" or n.startswith(f"{top}.{b}."))):
                    chain, at = [], hit
                    while at is not None:
                        chain.append(at)
                        at = via[at]
                    out.add(f"{module} -> {b} (via {' <- '.join(chain)})")
                    break
    return out


def test_every_layer_keeps_to_its_rules():
    assert layer_violations(PACKAGE) == set()


def test_the_climbs_left_are_all_still_there():
    gone = CLIMBS - {f"{m} -> {n}" for m, n in climbs(PACKAGE)}
    assert not gone, f"no longer imported: take them off CLIMBS: {sorted(gone)}"


def test_every_module_is_on_a_floor():
    floors = {_floor(_module_name(PACKAGE, p)) for p in PACKAGE.rglob("*.py")}
    assert floors == set(MAY_IMPORT) | LEAVES | set(COMPAT) | {None, "__main__"}


def test_the_import_graph_is_read_from_the_real_code():
    modules = {_module_name(PACKAGE, p) for p in PACKAGE.rglob("*.py")}
    imported = _imported(PACKAGE, PACKAGE / "cli" / "app.py", modules)
    assert {"tinygpt_cli.surfaces.commands", "tinygpt_cli.render.text",  # from ..x import y
            "tinygpt_cli.cli.typer_tricks",  # from .typer_tricks import ...
            "tinygpt_cli.jobs.threads", "tinygpt_cli.errors"} <= imported  # inside a function
    assert len(modules) > 90


# One planted import a rule: (file, the line, the rule's layer and banned module it breaks),
# in every form the resolver must read.
PLANTED = [
    ("cli/texts.py", "from ..transformer import model", "cli", "transformer.model"),
    ("cli/cards.py", "def _f():\n    import tinygpt_cli.transformer.trace as t\n    return t",
     "cli", "transformer.trace"),
    ("cli/inspect.py", "from ..transformer.ops import softmax", "cli", "transformer.ops"),
    ("analysis/lens.py", "from ..jobs.train import loop", "analysis", "jobs.train"),
    ("analysis/dla.py", "def _f():\n    from tinygpt_cli.render.text import LN2\n    return LN2",
     "analysis", "render"),
    ("analysis/heads.py", "from .. import cli", "analysis", "cli"),
    ("transformer/model.py", "from . import sampling", "transformer.model",
     "transformer.sampling"),
    ("transformer/trace.py", "import tinygpt_cli.transformer.generate", "transformer.trace",
     "transformer.generate"),
    ("transformer/ops.py", "def _f():\n    from .sampling import sample\n    return sample",
     "transformer.ops", "transformer.sampling"),
    ("render/texts.py", "def _f():\n    from ..analysis.score import DRAWN_TOKENS\n"
     "    return DRAWN_TOKENS", "render", "transformer.model"),  # what runs the model
    ("render/cards.py", "from ..jobs import session", "render", "jobs.session"),
    ("render/svg.py", "def _f():\n    from .. import load\n    return load", "render",
     "jobs.session"),  # the package's lazy name: its module (surfaces.api) opens sessions
    ("render/heads.py", "import importlib\n_m = importlib.import_module('..jobs.ahead', "
     "__package__)", "render", "jobs.ahead"),
    ("jobs/session.py", "def _f():\n    from .ahead import Ahead\n    return Ahead",
     "jobs.session", "jobs.ahead"),
    ("jobs/session.py", "from ..cli import batch", "jobs.session", "cli.batch"),
]


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    """A copy of the package, each plant made in it and taken back."""
    import shutil

    copy = tmp_path_factory.mktemp("planted") / "tinygpt_cli"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert layer_violations(copy) == set()
    return copy


def _planted(copy: Path, file: str, line: str) -> tuple[str, set[str]]:
    target = copy / file
    before = target.read_text(encoding="utf-8")
    target.write_text(before + "\n\n" + line + "\n", encoding="utf-8")
    try:
        return _module_name(copy, target), layer_violations(copy)
    finally:
        target.write_text(before, encoding="utf-8")


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: f"{p[0]} {p[3]}")
def test_a_planted_violation_of_each_rule_is_caught(package_copy, planted):
    file, line, layer, banned = planted
    module, found = _planted(package_copy, file, line)
    assert any(v.startswith(f"{module} -> {banned} ") for v in found), found
    assert all(module in v for v in found), found  # nothing but the plant, and what reaches it


# One plant a floor: an import of a floor MAY_IMPORT does not give it (file, line, the module
# imported).
PLANTED_FLOORS = [
    ("surfaces/commands.py", "from ..storage import files", None),  # allowed: nothing caught
    ("jobs/shards.py", "from ..cli import common", "tinygpt_cli.cli.common"),
    ("jobs/train/loop.py", "def _f():\n    from ...render import svg\n    return svg",
     "tinygpt_cli.render.svg"),
    ("analysis/lens.py", "from ..jobs import ahead", "tinygpt_cli.jobs.ahead"),
    ("analysis/qk.py", "from ..surfaces import commands", "tinygpt_cli.surfaces.commands"),
    ("render/numbers.py", "from ..analysis import question", "tinygpt_cli.analysis.question"),
    ("transformer/wiring.py", "from ..render import text", "tinygpt_cli.render.text"),
    ("transformer/families/gpt2.py", "import tinygpt_cli.jobs.cluster",
     "tinygpt_cli.jobs.cluster"),
    ("storage/files.py", "from ..transformer import config", "tinygpt_cli.transformer.config"),
    ("storage/madefor.py", "from ..jobs import threads", "tinygpt_cli.jobs.threads"),
    ("words.py", "from .storage import files", "tinygpt_cli.storage.files"),
    ("errors.py", "def _f():\n    from . import words\n    return words", "tinygpt_cli.words"),
    ("entry.py", "from .cli import app", "tinygpt_cli.cli.app"),  # compat: its target alone
]


@pytest.mark.parametrize("planted", PLANTED_FLOORS, ids=lambda p: p[0])
def test_a_planted_import_up_or_across_the_floors_is_caught(package_copy, planted):
    file, line, imported = planted
    module, found = _planted(package_copy, file, line)
    assert found == ({f"{module} -> {imported} (climbs)"} if imported else set())


# ------------------------------------------------------------------ dependencies you can see

# Imports sit at the top of each module. Inside a function only: in cli/ (start-up: a command
# line imports the module of its own command alone), an optional extra (a clean install lacks
# it), and these few elsewhere, each keeping NumPy, Rich, OpenSSL or an extra's reader out of
# a start-up that does not need it (`tinygpt --help`, `encode` without NumPy, `attn` without
# Rich): at most INSIDE_FUNCTIONS in all (53 when it was set).
EXTRAS = {"dask", "distributed", "mcp", "mcp_types", "anyio", "huggingface_hub", "resvg",
          "resvg_py", "torch", "gguf", "jinja2"}
INSIDE_FUNCTIONS = 60


def _inner(node, inside: bool, found: list[str]) -> list[str]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue
        if inside and isinstance(child, ast.Import | ast.ImportFrom):
            names = [a.name for a in child.names] if isinstance(child, ast.Import) \
                else [child.module or ""]
            if getattr(child, "level", 0) or any(n.split(".")[0] not in EXTRAS for n in names):
                found.append(f"{child.lineno}: {ast.unparse(child)}")
        _inner(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef), found)
    return found


def inner_imports(root: Path) -> dict[str, list[str]]:
    """module -> the import statements inside its functions (each once, however deeply
    nested), outside cli/ and TYPE_CHECKING blocks, but those of optional extras alone."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        if module == f"{root.name}.cli" or module.startswith(f"{root.name}.cli."):
            continue
        found = _inner(ast.parse(path.read_text(encoding="utf-8")), False, [])
        if found:
            out[module] = found
    return out


def cycles(root: Path) -> list[list[str]]:
    """The import cycles of the package at `root`, imports inside functions counted: each
    strongly connected group of two modules or more, sorted (Tarjan's algorithm). A module's
    own packages are left out of what it imports (Python runs them first anyway)."""
    paths = {_module_name(root, p): p for p in root.rglob("*.py")}
    graph = {m: sorted(n for n in _imported(root, p, set(paths))
                       if n != m and not m.startswith(n + ".")) for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def test_no_import_cycle():
    assert cycles(PACKAGE) == []


def test_imports_sit_at_the_top():
    found = inner_imports(PACKAGE)
    total = sum(map(len, found.values()))
    assert total <= INSIDE_FUNCTIONS, {m: len(v) for m, v in found.items()}


def test_a_planted_cycle_and_import_inside_a_function_are_caught(package_copy):
    assert cycles(package_copy) == []
    before = inner_imports(package_copy)
    ops = package_copy / "transformer" / "ops.py"
    text = ops.read_text(encoding="utf-8")
    ops.write_text(text + "\n\ndef _f():\n    import dask\n    from . import model\n"
                   "    return model, dask\n", encoding="utf-8")
    try:
        assert ["tinygpt_cli.transformer.model", "tinygpt_cli.transformer.ops"] in \
            [[m for m in g if m.endswith((".model", ".ops"))] for g in cycles(package_copy)]
        after = inner_imports(package_copy)
        added = after["tinygpt_cli.transformer.ops"][len(before.get(
            "tinygpt_cli.transformer.ops", [])):]
        assert [a.split(": ", 1)[1] for a in added] == ["from . import model"]  # not dask
    finally:
        ops.write_text(text, encoding="utf-8")
    app = package_copy / "cli" / "app.py"
    text = app.read_text(encoding="utf-8")
    app.write_text(text + "\n\ndef _g():\n    import json\n    return json\n", encoding="utf-8")
    try:
        assert inner_imports(package_copy) == before  # cli/ may: start-up
    finally:
        app.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------ one exit

# generate writes its tokens as they are made (and --json a line each): a stream, not one
# result; the training commands' results are files, their progress and notes go to stderr.
OWN_EXIT = {"cli/inspect.py generate", "cli/train.py train_cmd",
            "cli/train.py train_tokenizer_cmd", "cli/train.py model_card_cmd"}


def _writes_out(node) -> list:
    """The calls under `node` that write a result on stdout: jsonout.emit, print,
    sys.stdout.write, stdout(...).print."""
    found = []
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        f, name = call.func, ast.unparse(call.func)
        if name in ("print", "sys.stdout.write") or name.endswith("jsonout.emit") \
                or (isinstance(f, ast.Attribute) and f.attr == "print"
                    and isinstance(f.value, ast.Call) and ast.unparse(f.value.func) == "stdout"):
            found.append(call)
    return found


def exits(source: str, where: str = "") -> dict[str, str]:
    """command -> how its result does not go out through present() (render.output.present,
    the one exit of every command): it writes it itself, or never calls present. The module's
    functions a command calls (cards.show, cards._norm) are read as its own; a write inside
    what it hands to present as `show=` (a lambda, or a function of its own) is present's."""
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    wrong = {}
    for node in functions.values():
        if not _is_command(node) or f"{where} {node.name}" in OWN_EXIT:
            continue
        reached, todo = {node.name}, [node]
        for f in todo:
            for c in ast.walk(f):
                name = ast.unparse(c.func) if isinstance(c, ast.Call) else None
                if name in functions and name not in reached:
                    reached.add(name)
                    todo.append(functions[name])
        calls = [c for f in todo for c in ast.walk(f) if isinstance(c, ast.Call)]
        presents = [c for c in calls if ast.unparse(c.func) == "present"]
        shown = [kw.value for c in presents for kw in c.keywords if kw.arg == "show"]
        handed = {id(w) for v in shown for w in _writes_out(v)}
        handed |= {id(w) for f in todo for d in ast.walk(f) if isinstance(d, ast.FunctionDef)
                   and any(ast.unparse(v) == d.name for v in shown) for w in _writes_out(d)}
        own = sorted({ast.unparse(w.func) for f in todo for w in _writes_out(f)
                      if id(w) not in handed})
        if own:
            wrong[node.name] = f"writes its result itself: {own}"
        elif not presents:
            wrong[node.name] = "never calls present()"
    return wrong


def test_present_is_the_one_exit_of_every_command():
    wrong = {}
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        where = str(path.relative_to(PACKAGE))
        wrong.update({f"{where} {k}": v for k, v in
                      exits(path.read_text(encoding="utf-8"), where).items()})
    assert wrong == {}


def test_a_command_that_prints_its_own_result_is_caught():
    planted = '''
@app.command()
def one(context, as_json: bool = JSON):
    if as_json:
        jsonout.emit({"a": 1})
        return
    stdout(context).print("a")


@app.command()
def two(context, as_json: bool = JSON):
    present(context, as_json, lambda: {"a": 1}, lambda: "a")


@app.command()
def three(context, text: str = TEXT):
    sys.stdout.write(text)


@app.command()
def five(context, as_json: bool = JSON):
    return _helper(context)


def _helper(context):
    print("five")


@app.command()
def four(context, as_json: bool = JSON):
    def show(v):
        stdout(context).print(v)

    present(context, as_json, lambda: {"a": 1}, lambda: "a", show=show)
'''
    assert exits(planted) == {"one": "writes its result itself: ['jsonout.emit', "
                                     "'stdout(context).print']",
                              "three": "writes its result itself: ['sys.stdout.write']",
                              "five": "writes its result itself: ['print']"}


def test_entry_and_app_do_not_import_each_other():
    app_source = (PACKAGE / "cli" / "app.py").read_text(encoding="utf-8")
    assert "entry" not in {n.module for n in ast.walk(ast.parse(app_source))
                           if isinstance(n, ast.ImportFrom)}
    from tinygpt_cli.cli import entry, exits

    assert entry.INTERRUPTED is exits.INTERRUPTED == 130
    assert (exits.OK, exits.FAULT, exits.USAGE) == (0, 1, 2)


# ------------------------------------------------------------------ the Typer trick


def test_typer_still_has_what_the_start_up_trick_replaces():
    """quick_coercion quietly does nothing on a typer without these internals, and start-up
    slows down by the Pydantic import; this test is what notices."""
    from typer._coercion import RuntimeParam, build_runtime_param  # noqa: F401
    from typer._param_types import _path_options_requested, coerce_cli_path  # noqa: F401
    from typer.core import _TyperParameter

    from tinygpt_cli.cli.typer_tricks import click_errors, quick_coercion

    quick_coercion()
    assert _TyperParameter._tinygpt_quick is True
    assert issubclass(click_errors.NoSuchOption, click_errors.UsageError)


def test_quick_coercion_gives_what_typer_gives(tmp_path):
    import typer

    from tinygpt_cli.cli.typer_tricks import click_command, click_errors, quick_coercion

    quick_coercion()
    app = typer.Typer()
    seen = {}

    @app.callback()
    def group():
        pass

    @app.command()
    def one(n: int = typer.Option(3, "--n", min=1), x: float = typer.Option(0.5, "--x"),
            p: Path = typer.Option(None, "--p"), s: list[str] = typer.Option(None, "--s"),
            w: Path = typer.Option(None, "--w", parser=str)):
        seen.update(n=n, x=x, p=p, s=s, w=w)

    @app.command()
    def two():
        seen["two"] = True

    command = click_command(app, "one")
    assert set(command.commands) == {"one"}  # only the chosen command is built
    command.main(["one", "--n", "7", "--x", "1e-3", "--p", str(tmp_path), "--s", "a",
                  "--s", "b", "--w", ""], standalone_mode=False)
    # a parser's result as it is: the empty name stays "" (not Path(""), the current folder)
    assert seen == {"n": 7, "x": 1e-3, "p": tmp_path, "s": ["a", "b"], "w": ""}
    assert type(seen["n"]) is int and type(seen["x"]) is float
    with pytest.raises(click_errors.BadParameter, match="greater than or equal to 1"):
        command.main(["one", "--n", "0"], standalone_mode=False)
    with pytest.raises(click_errors.BadParameter):
        command.main(["one", "--x", "many"], standalone_mode=False)
    assert len(app.registered_commands) == 2  # the others are back


def test_the_listing_without_the_commands_is_the_help_typer_gives():
    # `tinygpt --help` lists each command by its name and line in cli.app.SUMMARIES, importing
    # none of them (start-up); the page must be the one the whole app gives, word for word,
    # at any width (click cuts each line to fit), so the table cannot go stale
    import inspect

    from tinygpt_cli.cli.app import SUMMARIES, _register, app
    from tinygpt_cli.cli.typer_tricks import click_command
    from tinygpt_cli.cli.typer_tricks import command_name as app_command_name

    _register()
    callbacks = {**{app_command_name(c): c.callback for c in app.registered_commands},
                 **{g.name: g.typer_instance.registered_callback.callback
                    for g in app.registered_groups}}
    assert SUMMARIES == {n: inspect.getdoc(f).splitlines()[0] for n, f in callbacks.items()}
    for width in (40, 64, 80, 100, 200):
        pages = []
        for listing in (None, SUMMARIES):
            group = click_command(app, None, listing=listing)
            pages.append(group.get_help(group.make_context(
                "tinygpt", ["--help"], resilient_parsing=True, terminal_width=width)))
        assert pages[0] == pages[1] and "attn" in pages[1], width
    light = click_command(app, None, listing=SUMMARIES)
    assert not light.commands["attn"].params  # built without them
    assert click_command(app, None).commands["attn"].params
