"""The versions of what the plugin writes for later readers: records, the report, the refs.

Each carries a number that grows when its meaning changes, so a reader can tell an older
format (read as it was: every version so far only added fields) from a newer one (refused
with a message saying to upgrade, never misread):

- an attempt record's ``Agentgate-Schema`` trailer: absent in 0.1 and 0.2's records (version
  1), 2 since records may be renumbered on a server and carry ``Max-Changed-Lines``;
- the JSON report's ``schema_version`` (absent: version 1);
- the refs layout, a blob at ``refs/agentgate/layout`` (absent: the layout before it was
  versioned, version 1; version 2 has ``dryruns/<run>/<b>``, ``checkpoints/``,
  ``servers/``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AgentgateError

if TYPE_CHECKING:
    from ..git.repo import BaseRepo

RECORD_VERSION = 2
REPORT_VERSION = 2
REFS_LAYOUT = 2
LAYOUT_REF = "refs/agentgate/layout"
_LAYOUT_TEXT = "pytest-agentgate refs layout {n}\n"


class TooNew(AgentgateError):
    """Something here was written by a newer pytest-agentgate than this one reads."""

    def __init__(self, what: str, found: int, known: int) -> None:
        self.what, self.found, self.known = what, found, known
        super().__init__(
            f"{what} was written by a newer pytest-agentgate (version {found}; this one reads "
            f"up to {known}): upgrade pytest-agentgate to read it"
        )


def record_version(trailers: dict[str, str]) -> int:
    """A record's schema version (1 when it has none: 0.1 and 0.2's)."""
    raw = trailers.get("Schema", "1")
    return int(raw) if raw.isdigit() else RECORD_VERSION + 1


def check_record(ref: str, trailers: dict[str, str]) -> None:
    """Refuse to act on a record this version cannot read whole (:class:`TooNew`)."""
    found = record_version(trailers)
    if found > RECORD_VERSION:
        raise TooNew(f"the attempt record {ref}", found, RECORD_VERSION)


def layout(repo: BaseRepo) -> int:
    """The refs layout of ``repo`` (1 when it has no layout ref: 0.1's)."""
    oid = repo.refs.value(LAYOUT_REF)
    if oid is None:
        return 1
    text = (repo.read_blob(oid) or b"").decode("utf-8", "replace").strip()
    tail = text.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else REFS_LAYOUT + 1


def ensure_layout(repo: BaseRepo) -> None:
    """Before a run writes refs: refuse a newer layout; mark an older one (or none) as this
    version's. The older layout needs no rewrite: its only difference, a shared scratch ref
    of dry runs, is read by nothing."""
    found = layout(repo)
    if found > REFS_LAYOUT:
        raise TooNew(f"the agentgate refs of {repo.label}", found, REFS_LAYOUT)
    if found == REFS_LAYOUT:
        return
    blob = repo.hash_blob(_LAYOUT_TEXT.format(n=REFS_LAYOUT).encode())
    repo.refs.update(LAYOUT_REF, blob, repo.refs.value(LAYOUT_REF), "agentgate: refs layout")
