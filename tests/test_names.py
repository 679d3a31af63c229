"""The code follows its own glossary (docs/glossary.md): the names it lists as not to use are
absent, each key type and the dispatch rule have one home, no constant is defined twice, and every
job package is laid out as docs/jobs.md says. Each check is also run on a hand-built module, to show
it finds what it looks for."""

from __future__ import annotations

import ast
import io
import re
import struct
import tokenize
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "broker_model", "jobs")
GLOSSARY = ROOT / "docs" / "glossary.md"

# identifiers the glossary's "Names not to use" table retires everywhere
RETIRED = ("next_offset", "queue_next", "end_of_queue", "QUEUE_KEYS")
# the modules where a retired name is a protocol's own field, with which
PROTOCOL_FIELDS = {
    "broker_model/endpoint/consumer.py": {"next_offset": "the field of RocketMQ 5's PullMessageResponse"},
}

# words that must not name a consume-queue row or a record (glossary: use "consume-queue row",
# "record"), and the modules where they name something else, with what
ROW_WORDS = frozenset({"unit", "units", "entry", "entries"})
OTHER_MEANINGS = {
    "broker_model/broker/rebalance_locks.py": "a lock entry of the rebalance lock table",
    "broker_model/common/codec.py": "a UTF-16 code unit of Java's String.hashCode",
    "jobs/rules.py": "a UTF-16 code unit of Java's String.hashCode",
    "broker_model/common/timeutil.py": "a time unit of a duration",
    "broker_model/broker/put.py": "the time unit of a timer property",
    "broker_model/endpoint/service.py": "the entries field of RocketMQ 5's SendMessageResponse",
    "broker_model/endpoint/consumer.py": "the entries of RocketMQ 5's AckMessageRequest and AckMessageResponse",
    "broker_model/store/store_export.py": "the 20-byte unit of a RocketMQ consume queue file",
    "jobs/rebuild_consume_queue/verify.py": "the 20-byte unit of a RocketMQ consume queue file",
    "jobs/rebuild_consume_queue/job.py": "the 20-byte unit of a RocketMQ consume queue file",
}
ROW_PHRASE = re.compile(r"\b(consume[- ]queue|cq|queue) (units?|entry|entries)\b", re.IGNORECASE)

# the key types of the glossary and the one module that declares them
KEY_TYPES = ("QueueKey", "GroupQueueKey", "RecordKey", "QUEUE_KEY", "GROUP_QUEUE_KEY")
KEY_HOME = "broker_model/common/rules.py"

# the dispatch rule's transaction types, and the modules that state the rule (Python and Spark forms)
DISPATCH_NAMES = ("DISPATCHED_TRANSACTION_TYPES",)
DISPATCH_HOMES = ("broker_model/common/rules.py", "jobs/rules.py")

# constants every job package defines for itself (docs/jobs.md, "How a job package is laid out")
JOB_ROLE_CONSTANTS = frozenset({"JOB", "APP_ID", "INPUTS", "STATES", "OPEN_STATES", "DRIVER_DECODE", "DRIVER_RECORDS"})

# the modules of a job package and what each holds (docs/jobs.md, "How a job package is laid out")
JOB_PACKAGE_ROLES = {
    "__init__": "the package face",
    "job": "the entry: config, run, main",
    "transforms": "Spark transforms",
    "fold": "the driver-side computation",
    "decode": "records decoded on the driver",
    "reads": "lake reads on the driver",
}


def product_files() -> dict[str, Path]:
    return {p.relative_to(ROOT).as_posix(): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def tokens(path: Path) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))


def retired_names(files: dict[str, Path]) -> list[str]:
    return [
        f"{name}:{token.start[0]} {token.string}"
        for name, path in sorted(files.items())
        for token in tokens(path)
        if token.type == tokenize.NAME and token.string in RETIRED and token.string not in PROTOCOL_FIELDS.get(name, {})
    ]


def row_words(files: dict[str, Path]) -> list[str]:
    """Identifiers with a part of :data:`ROW_WORDS`, and prose that calls a consume-queue row a unit
    or an entry, outside the modules where the word names something else."""
    found = []
    for name, path in sorted(files.items()):
        for token in tokens(path):
            if token.type == tokenize.NAME and ROW_WORDS & set(token.string.lower().split("_")):
                if name not in OTHER_MEANINGS:
                    found.append(f"{name}:{token.start[0]} {token.string}")
            elif token.type in (tokenize.STRING, tokenize.COMMENT) and ROW_PHRASE.search(token.string):
                found.append(f"{name}:{token.start[0]} {ROW_PHRASE.search(token.string).group(0)!r}")
    return found


def module_constants(path: Path) -> Iterable[tuple[str, int, ast.expr]]:
    """(name, line, value) of the module-level UPPER_CASE assignments of ``path``. A type variable
    (``_T = TypeVar("_T")``) is a device of its module's annotations, not a constant, and is left out."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign):
            targets, value = [t for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "TypeVar":
            continue
        for target in targets:
            if re.fullmatch(r"_?[A-Z][A-Z0-9_]*", target.id):
                yield target.id, node.lineno, value


def _substantial(value: ast.expr) -> bool:
    """Whether a constant's value is one that two modules cannot share by chance: a struct layout,
    a regular expression, a literal collection of two or more items, or a text of four or more
    characters that is not a bare word."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        return value.func.attr in ("Struct", "compile")
    if isinstance(value, ast.Tuple | ast.List | ast.Set | ast.Dict):
        return len(value.keys if isinstance(value, ast.Dict) else value.elts) >= 2
    text = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""
    return len(text) >= 4 and not text.isidentifier()  # a bare word (a job's name) may recur


def defined_twice(files: dict[str, Path]) -> list[str]:
    """Constants named alike in two modules (beyond the job packages' role constants), and
    substantial values (:func:`_substantial`) defined in two modules under any names."""
    by_name: dict[str, list[str]] = defaultdict(list)
    by_value: dict[str, list[str]] = defaultdict(list)
    for name, path in sorted(files.items()):
        for constant, line, value in module_constants(path):
            by_name[constant.lstrip("_")].append(f"{name}:{line}")
            if _substantial(value):
                by_value[ast.dump(value)].append(f"{name}:{line} {constant}")
    found = [f"{c} at {places}" for c, places in by_name.items() if len(places) > 1 and c not in JOB_ROLE_CONSTANTS]
    for places in by_value.values():
        if len({place.split(":")[0] for place in places}) > 1:
            found.append(f"one value at {places}")
    return found


def key_types_declared_elsewhere(files: dict[str, Path]) -> list[str]:
    return [
        f"{name}:{line} {constant}"
        for name, path in sorted(files.items())
        if name != KEY_HOME
        for constant, line, _ in _assignments(path)
        if constant in KEY_TYPES
    ]


def _assignments(path: Path) -> Iterable[tuple[str, int, ast.expr]]:
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.lineno, node.value


def dispatch_rule_restated(files: dict[str, Path]) -> list[str]:
    """Uses of the dispatch rule's transaction types outside the modules that state the rule, and
    a ``sys_flag & TRANSACTION_ROLLBACK_TYPE`` compared with ``in`` anywhere but there."""
    found = []
    for name, path in sorted(files.items()):
        if name in DISPATCH_HOMES:
            continue
        found += [
            f"{name}:{token.start[0]} {token.string}"
            for token in tokens(path)
            if token.type == tokenize.NAME and token.string in DISPATCH_NAMES
        ]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
                if "TRANSACTION_ROLLBACK_TYPE" in ast.unparse(node.left):
                    found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    return found


def job_package_layout() -> list[str]:
    """Modules of the job packages (a folder under jobs/ other than lake) whose name is neither a
    role of :data:`JOB_PACKAGE_ROLES` nor listed in the package's own docstring, and packages
    without a ``job`` module."""
    found = []
    for package in sorted(p for p in (ROOT / "jobs").iterdir() if (p / "__init__.py").exists() and p.name != "lake"):
        face = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        for module in sorted(package.glob("*.py")):
            if module.stem not in JOB_PACKAGE_ROLES and f"``{module.stem}``" not in face:
                found.append(f"jobs/{package.name}/{module.name}: neither a role nor named in the package docstring")
        if not (package / "job.py").exists():
            found.append(f"jobs/{package.name}: no job module")
    return found


def test_the_retired_names_are_absent() -> None:
    assert retired_names(product_files()) == []


def test_consume_queue_rows_are_not_called_units_or_entries() -> None:
    assert row_words(product_files()) == []


def test_the_key_types_are_declared_once() -> None:
    assert key_types_declared_elsewhere(product_files()) == []


def test_the_dispatch_rule_is_stated_in_its_homes_only() -> None:
    assert dispatch_rule_restated(product_files()) == []


def test_no_constant_is_defined_twice() -> None:
    assert defined_twice(product_files()) == []


def test_every_job_package_has_the_documented_layout() -> None:
    assert job_package_layout() == []


def test_the_glossary_lists_what_the_checks_retire() -> None:
    """The checks and the glossary's table of names not to use say the same."""
    retired_table = GLOSSARY.read_text().split("## Names not to use", 1)[1]
    for name in (*RETIRED, "unit", "entry", "QueueKey"):
        assert name in retired_table, name


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import struct\n"
        "QUEUE_KEY = ('broker_name', 'topic', 'queue_id')\n"
        "RECORD_HEAD = struct.Struct('>iiiiiqqiq')\n"
        "PERSIST_CONSUMER_OFFSET_INTERVAL_MS = 5000\n"
        "def f(queue_next, cq_units, sys_flag):\n"
        "    # the consume queue entries of a queue\n"
        "    return sys_flag & c.TRANSACTION_ROLLBACK_TYPE in DISPATCHED_TRANSACTION_TYPES\n"
    )
    files = {"bad.py": bad}
    assert retired_names(files) == ["bad.py:5 queue_next"]
    assert row_words(files) == ["bad.py:5 cq_units", "bad.py:6 'consume queue entries'"]
    assert key_types_declared_elsewhere(files) == ["bad.py:2 QUEUE_KEY"]
    assert dispatch_rule_restated(files) == [
        "bad.py:7 DISPATCHED_TRANSACTION_TYPES",
        "bad.py:7 sys_flag & c.TRANSACTION_ROLLBACK_TYPE in DISPATCHED_TRANSACTION_TYPES",
    ]
    twice = defined_twice({**files, **{name: ROOT / name for name in ("broker_model/store/record.py",)}})
    assert any("one value at" in line and "RECORD_HEAD" in line for line in twice)
    with_constants = {"bad.py": bad, "broker_model/common/constants.py": ROOT / "broker_model/common/constants.py"}
    assert any(line.startswith("PERSIST_CONSUMER_OFFSET_INTERVAL_MS at") for line in defined_twice(with_constants))
    assert struct.calcsize(">iiiiiqqiq") == 48  # the layout the hand-built module repeats
