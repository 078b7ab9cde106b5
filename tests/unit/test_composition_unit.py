"""Parts are held, not inherited: no class of the package takes a base class from another
of its modules, except the siblings of one protocol (or one abstract base) and the errors.

A chain of base classes across modules, cut so that each piece passes the size check, reads
as one class whose calls jump between files; the queue was four of them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_agentgate"

#: Bases a class may take from another module: protocols that siblings implement (the
#: targets share how a move is logged, and a dry run is a local branch that moves a scratch
#: ref), and the error classes every module raises.
SHARED_BASES = {"Target", "_LogsMoves", "LocalBranch", "AgentgateError", "ConfigError", "Protocol"}


def _classes() -> dict[str, str]:
    """Every class of the package, by name: the module that defines it."""
    found: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, str(path.relative_to(PACKAGE)))
    return found


def test_no_class_inherits_from_a_class_in_another_module() -> None:
    defined = _classes()
    chains = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = getattr(base, "id", getattr(base, "attr", ""))
                home = defined.get(name)
                if home is None or home == where or name in SHARED_BASES:
                    continue
                if name.endswith(("Error", "Broken", "Failed")) or home == "errors.py":
                    continue
                chains.append(f"{where}: {node.name}({name} of {home})")
    assert chains == []


def test_the_queue_holds_its_parts() -> None:
    """The landing queue is built from parts with narrow interfaces (files, server posts,
    recovery, leader), none of them a base class of another."""
    from pytest_agentgate.land import leader, posting, queue, queue_folder, recovery

    for module in (queue_folder, posting, recovery, leader):
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__:
                assert value.__bases__ == (object,) or value.__bases__[0].__name__ in (
                    "Protocol",
                    "tuple",
                ), value
    assert queue.LandingQueue.__bases__ == (object,)


def test_the_repository_holds_its_place_refs_and_history(tmp_path: Path) -> None:
    """``BaseRepo`` is given its parts, as dulwich's ``Repo`` is given its ref container:
    one place (where it is, git run against it) shared by its refs and its history."""
    from pytest_agentgate.git import history, place, refs, repo

    assert repo.BaseRepo.__bases__ == (object,)
    (tmp_path / "config").write_text("[extensions]\n\tobjectformat = sha256\n")
    base = repo.BaseRepo(tmp_path, None)
    assert isinstance(base.place, place.Place) and base.place.oid_length == 64
    assert isinstance(base.refs, refs.Refs) and base.refs.place is base.place
    assert isinstance(base.history, history.History) and base.history.place is base.place
    assert base.null_oid == "0" * 64 and base.bare and base.label == str(tmp_path)
    # A ref question is asked of the refs, a history question of the history: not both.
    assert not {"update_ref", "ref_value", "resolve_commit", "is_ancestor"} & set(dir(base))
