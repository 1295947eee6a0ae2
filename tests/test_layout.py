"""The plan of `focus/`: imports run one way through the wings that the module table in docs/library.md lists, with no
loop, and no module grows past the size the house style names; the native kernels keep a room of their own."""

import ast
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "focus"
MAX_LINES = 450
# Lowest first: a module may import its own wing and the wings before it. The train and eval wings sit side by side
# and do not import each other.
WINGS = (
    {"core": ("focus.version", "focus.config", "focus.files", "focus.artifacts", "focus.provenance", "focus.models",
              "focus.data", "focus.distributed", "focus.attention", "focus.lazy", "focus.sources")},
    {"retrofit": ("focus.retrofit", "focus.adapter", "focus.hub", "focus.__init__")},
    {"train": ("focus.train",), "eval": ("focus.eval",)},
    {"pipeline": ("focus.pipeline",)},
    {"report": ("focus.report",)},
    {"command": ("focus.cli", "focus.lm_eval")},
)


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The focus modules `name` imports anywhere in its body (deferred imports in functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def wing(name: str) -> tuple[int, str]:
    key = "focus.__init__" if name == "focus" else name
    for level, rooms in enumerate(WINGS):
        for room, prefixes in rooms.items():
            if any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes):
                return level, room
    raise AssertionError(f"{name} is in no wing: add it to WINGS and to the module table in docs/library.md")


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_import_runs_down_the_wings():
    wrong = []
    for name, targets in graph().items():
        level, room = wing(name)
        for target in sorted(targets):
            target_level, target_room = wing(target)
            if target_level > level or (target_level == level and target_room != room):
                wrong.append(f"{name} ({room}) imports {target} ({target_room})")
    assert not wrong, "\n".join(wrong)


def test_no_import_loop():
    edges, loops = graph(), []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                loops.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not loops, "\n".join(loops)


def test_no_module_past_the_house_size():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_checks_see_a_loop_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above are not vacuous: a planted loop between two core modules and an import of the report wing
    from the core are both reported."""
    known = {"focus.config": tmp_path / "config.py", "focus.files": tmp_path / "files.py",
             "focus.report.claims": tmp_path / "claims.py"}
    known["focus.config"].write_text("from focus.files import atomic_write\nfrom focus.report import claims\n")
    known["focus.files"].write_text("def f():\n    from focus.config import FocusConfig\n")
    known["focus.report.claims"].write_text("")
    monkeypatch.setitem(globals(), "modules", lambda: known)
    assert graph() == {"focus.config": {"focus.files", "focus.report.claims"}, "focus.files": {"focus.config"},
                       "focus.report.claims": set()}
    for check in (test_every_import_runs_down_the_wings, test_no_import_loop):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} missed what was planted")



ATTENTION_ROOMS = ("labels", "pattern", "native", "routers", "cache", "kernels", "dispatch", "function", "__main__")
"""The attention wing's packages, lowest first: a module imports its own package and those before it (the pattern
from nothing, the kernels from the routers and the cache they read, the dispatch table from the kernels it runs), so
no kernel imports the plan. `focus.attention` itself, the wing's entry, is above them all."""
ATTENTION_MAX_LINES = 400


def attention_room(name: str) -> int:
    if name == "focus.attention":
        return len(ATTENTION_ROOMS)
    room = name.removeprefix("focus.attention.").split(".")[0]
    assert room in ATTENTION_ROOMS, f"{name} is in no package of the attention wing: add it to ATTENTION_ROOMS"
    return ATTENTION_ROOMS.index(room)


def test_the_attention_wings_packages_import_downwards():
    wrong = [f"{name} imports {target}" for name, targets in graph().items() if name.startswith("focus.attention")
             for target in sorted(targets) if target.startswith("focus.attention")
             and attention_room(target) > attention_room(name)]
    assert not wrong, "\n".join(wrong)


def test_the_attention_wing_is_a_few_packages_of_small_modules():
    found = {name: path for name, path in modules().items() if name.startswith("focus.attention.")}
    top = sorted(name for name, path in found.items() if name.count(".") == 2 and path.name != "__init__.py")
    long = {name: n for name, path in found.items() if (n := len(path.read_text().splitlines())) > ATTENTION_MAX_LINES}
    assert top == ["focus.attention.__main__", "focus.attention.function", "focus.attention.labels"] and not long, (
        top, long)


def private_imports(path: Path, home: str) -> list[str]:
    """The private names (`_name`) that `path`, a module of package `home`, imports from another package's module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("focus"):
            if node.module.rpartition(".")[0] != home and node.module != home:
                found += [f"{node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.endswith("__")]
    return found


def test_no_module_imports_another_packages_private_names():
    wrong = {name: found for name, path in modules().items()
             if (found := private_imports(path, name if path.name == "__init__.py" else name.rpartition(".")[0]))}
    assert not wrong, wrong


def test_the_package_checks_see_an_upward_and_a_private_import(tmp_path, monkeypatch):
    """The checks above are not vacuous: a kernel that imports the plan, and a router that takes a cache's private
    helper, are both reported."""
    kernel, router = tmp_path / "band.py", tmp_path / "indexer.py"
    kernel.write_text("from focus.attention.dispatch.planning import plan\n")
    router.write_text("from focus.attention.cache.decoding import _private\nfrom focus.attention.routers.routing "
                      "import _own_package\n")
    assert private_imports(router, "focus.attention.routers") == ["focus.attention.cache.decoding._private"]
    known = {"focus.attention.kernels.band": kernel, "focus.attention.dispatch.planning": tmp_path / "planning.py"}
    known["focus.attention.dispatch.planning"].write_text("")
    monkeypatch.setitem(globals(), "modules", lambda: known)
    try:
        test_the_attention_wings_packages_import_downwards()
    except AssertionError:
        return
    raise AssertionError("the upward import of the plan was missed")

NATIVE = "focus.attention.native"
NATIVE_ROOM = PACKAGE / "attention" / "native"
NATIVE_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")
ROOM_TESTS = ("tests/test_native_step.py",)
"""The native room's own tests, which may reach inside it (to break its build on purpose)."""


def native_internals_imported(path: Path) -> list[str]:
    """The native room's modules that `path` imports by name (`focus.attention.native.build`, or `build` from the
    room), where only the room's package itself, `focus.attention.native`, is its entry."""
    rooms = {p.stem for p in NATIVE_ROOM.glob("*.py") if p.stem != "__init__"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if module.startswith(NATIVE + "."):
                found.append(module)
            elif module == NATIVE:
                found += [f"{NATIVE}.{alias.name}" for alias in node.names if alias.name in rooms]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith(NATIVE + ".")]
    return found


def test_nothing_outside_the_native_room_imports_its_internals():
    """The native kernels are entered through `focus.attention.native`'s public names (its `__all__`); their build,
    bindings and C++ are its own business."""
    root = PACKAGE.parent
    paths = [path for folder in ("focus", "tests", "benchmarks", "workflow", "examples", "scripts")
             for path in sorted((root / folder).rglob("*.py")) if NATIVE_ROOM not in path.parents]
    wrong = {str(path.relative_to(root)): found for path in paths
             if str(path.relative_to(root)) not in ROOM_TESTS and (found := native_internals_imported(path))}
    assert len(paths) > 100 and not wrong, wrong


def test_the_native_check_sees_an_import_of_the_rooms_internals(tmp_path):
    """The check above is not vacuous: each way of reaching inside is reported, the entry point is not."""
    script = tmp_path / "script.py"
    script.write_text("import focus.attention.native.build\nfrom focus.attention.native.prefill import native_merge\n"
                      "from focus.attention.native import build, kernels\nfrom focus.attention.native import MAX_DIM\n")
    assert native_internals_imported(script) == [
        "focus.attention.native.build", "focus.attention.native.prefill", "focus.attention.native.build"]


def test_native_sources_live_in_the_native_rooms_csrc_and_ship_in_the_wheel():
    tomllib = pytest.importorskip("tomllib")
    sources = sorted(path for path in PACKAGE.rglob("*") if path.suffix in NATIVE_SOURCE_SUFFIXES)
    assert sources and all(path.parent == NATIVE_ROOM / "csrc" for path in sources), sources
    settings = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = settings["package-data"][NATIVE]
    unshipped = [path.name for path in sources
                 if not any(fnmatch.fnmatch(str(path.relative_to(NATIVE_ROOM)), glob) for glob in shipped)]
    assert not unshipped, unshipped


def library_calls(script: Path) -> list[str]:
    """The names imported from `focus` that a rule script's top-level statements call, in order."""
    tree = ast.parse(script.read_text())
    imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] == "focus" for alias in node.names}
    return [node.func.id for statement in tree.body if not isinstance(statement, (ast.Import, ast.ImportFrom))
            for node in ast.walk(statement)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported]


def test_the_report_wing_reads_files_without_torch():
    """Report jobs read the records the evaluation jobs wrote: every report module imports without torch (about four
    seconds of start-up a table or a figure does not need)."""
    modules = sorted(f"focus.report.{path.stem}" for path in (PACKAGE / "report").glob("*.py"))
    code = f"import sys; import {', '.join(modules)}; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert len(modules) >= 6 and result.stdout.strip() == "[]"


# What the pipeline extra adds and neither the library's dependencies nor scripts/check_lowest.sh install.
PIPELINE_ONLY = ("pandas", "tabulate", "matplotlib", "snakemake", "wandb", "lm_eval", "peft", "datasets", "papermill",
                 "jsonschema")


def test_the_tests_of_the_lowest_versions_collect_without_the_pipeline_extra():
    """scripts/check_lowest.sh installs the library and pytest alone: a test it names that imports a report module
    (pandas) fails CI there only, after half an hour. Collect those files with the extra's packages absent."""
    files = re.findall(r"tests/test_\w+\.py", (PACKAGE.parent / "scripts" / "check_lowest.sh").read_text())
    code = (f"import sys\nfor name in {PIPELINE_ONLY!r}: sys.modules[name] = None  # import fails, find_spec is None\n"
            f"import pytest\nsys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *{files!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert len(files) >= 10 and result.returncode == 0, result.stdout[-3000:]


def test_every_rule_script_starts_its_job_then_makes_one_library_call():
    scripts = sorted((PACKAGE.parent / "workflow" / "scripts").glob("*.py"))
    calls = {script.name: library_calls(script) for script in scripts}
    wrong = {name: called for name, called in calls.items() if called[:1] != ["start_job"] or len(called) > 2}
    assert len(scripts) > 10 and not wrong, wrong


def test_the_script_check_counts_every_call(tmp_path):
    """The check above is not vacuous: the two calls of the training scripts before they were folded into one are
    both counted, the assigned one and the one inside another call's arguments too."""
    script = tmp_path / "train.py"
    script.write_text("from focus.pipeline.start import start_job\nfrom focus.pipeline.stages import train_focus\n"
                      "from focus.pipeline.jobs import TrainingJob\n\n"
                      "start_job('log', 1)\nsummary = train_focus(job=TrainingJob.from_rule(None))\n"
                      "print(train_focus())\n")
    assert library_calls(script) == ["start_job", "train_focus", "train_focus"]
