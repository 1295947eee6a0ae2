"""What the attention wing's docstrings and comments cite exists: every dotted Python name written in backticks
resolves, and every file they name is in the repository."""

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTENTION = ROOT / "focus" / "attention"
PACKAGES = ("focus.attention", *(f"focus.attention.{room.name}" for room in sorted(ATTENTION.iterdir())
                                 if (room / "__init__.py").exists() and room.name != "native"))
"""Where a short name (`routing.route_keys`, `rule.kept`) is looked for: the wing and each of its packages."""
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")
FOCUS_NAME = re.compile(r"(?<![\w.`])(focus(?:\.[A-Za-z_]\w*)+)")
FILE = re.compile(r"(?<![\w./<-])((?:\.\.?/)*[\w-]+(?:/[\w.-]+)*\.(?:py|md|cpp|h|csv|json|toml))\b")
IGNORED = {".git", ".venv", "node_modules"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def attention_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ATTENTION.rglob("*.py"))}


def docstrings(path: Path) -> list[str]:
    """The module's, classes' and functions' docstrings, and those under its names (a string after an assignment)."""
    return [node.value.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]


def comments(path: Path) -> list[str]:
    if path.suffix == ".py":
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        return [token.string for token in tokens if token.type == tokenize.COMMENT]
    return [line.split("//", 1)[1] for line in path.read_text().splitlines() if "//" in line]


def resolves(dotted: str, home: str) -> bool:
    """Whether `dotted` names something: from `focus.`, from a module of the attention wing or one of its packages
    (`routing.route_keys`, `kernels.band`; `build.kernels` inside the native room), or from a name of the citing module itself (`KeyRows.bits`). Other
    dotted words (`torch.topk`, a config key) are not this check's to judge: True."""
    first, *rest = dotted.split(".")
    in_native_room = home == "focus.attention.native" or home.startswith("focus.attention.native.")
    candidates = []
    if first == "focus":
        candidates.append(("focus", rest))
    for base in (*PACKAGES, "focus.attention.native") if in_native_room else PACKAGES:
        if importlib.util.find_spec(f"{base}.{first}") is not None:
            candidates.append((f"{base}.{first}", rest))
    module = importlib.import_module(home)
    if hasattr(module, first):
        candidates.append((None, [first, *rest]))
    if not candidates:
        return True
    return any(_walk(importlib.import_module(base) if base else module, names) for base, names in candidates)


def _walk(target, names: list[str]) -> bool:
    for i, name in enumerate(names):
        if hasattr(target, name):
            target = getattr(target, name)
            continue
        qualified = f"{getattr(target, '__name__', '')}.{name}"
        if hasattr(target, "__path__") and importlib.util.find_spec(qualified) is not None:  # a package's module
            target = importlib.import_module(qualified)
            continue
        fields = {f.name for f in dataclasses.fields(target)} if dataclasses.is_dataclass(target) else set()
        if isinstance(target, type) and i == len(names) - 1:  # an instance attribute set in the class's methods
            return name in fields | set(getattr(target, "__annotations__", {})) or re.search(
                rf"self\.{name}\b[^=\n]*=", inspect.getsource(target)) is not None
        return False
    return True


def test_every_dotted_name_in_the_attention_docstrings_resolves():
    unresolved = [f"{name}: `{dotted}`" for name, path in attention_modules().items() for text in docstrings(path)
                  for dotted in DOTTED.findall(text) if not resolves(dotted, name)]
    assert not unresolved, "\n".join(unresolved)


def test_every_focus_name_in_the_attention_comments_resolves():
    """Comments, the C++ sources' included, that name a `focus.` module or function by its full path."""
    files = [*ATTENTION.rglob("*.py"), *ATTENTION.rglob("*.cpp"), *ATTENTION.rglob("*.h")]
    unresolved = [f"{path.relative_to(ROOT)}: {dotted}" for path in files for text in comments(path)
                  for dotted in FOCUS_NAME.findall(text) if not resolves(dotted, "focus.attention")]
    assert not unresolved, "\n".join(unresolved)


def cited_files(path: Path) -> list[str]:
    texts = comments(path) + (docstrings(path) if path.suffix == ".py" else [])
    return [found for text in texts for found in FILE.findall(text)]


@functools.cache
def repository_file_names() -> frozenset[str]:
    return frozenset(path.name for path in ROOT.rglob("*") if not IGNORED & set(path.relative_to(ROOT).parts))


def in_repository(cited: str, citing: Path) -> bool:
    """A path with a folder is the repository's or the citing file's neighbour (never above the repository); a bare
    file name is some file of the repository's."""
    if "/" not in cited:
        return cited in repository_file_names()
    for base in (ROOT, citing.parent):
        target = (base / cited).resolve()
        if target.exists() and ROOT in target.parents:
            return True
    return False


def test_every_file_the_attention_wing_cites_is_in_the_repository():
    files = [*ATTENTION.rglob("*.py"), *ATTENTION.rglob("*.cpp"), *ATTENTION.rglob("*.h")]
    missing = [f"{path.relative_to(ROOT)}: {cited}" for path in files for cited in cited_files(path)
               if not in_repository(cited, path)]
    assert not missing, "\n".join(missing)


def test_the_checks_see_a_name_and_a_file_that_do_not_exist(tmp_path):
    """The checks above are not vacuous."""
    assert resolves("routing.route_keys", "focus.attention.cache.decoding")
    assert resolves("focus.attention.native.kernels", "focus.attention.cache.decoding")
    assert not resolves("routing.route_natively", "focus.attention.cache.decoding")
    assert not resolves("focus.attention.native_step.native_step", "focus.attention.cache.decoding")
    assert resolves("KeyRows.bits", "focus.attention.kernels.rectangle")
    assert not resolves("KeyRows.pits", "focus.attention.kernels.rectangle")
    citing = ATTENTION / "cache" / "decoding.py"
    assert in_repository("docs/decoding.md", citing) and in_repository("tests/test_decoding.py", citing)
    assert not in_repository("../shared/FACTS.md", citing) and not in_repository("report/claims.py", citing)
