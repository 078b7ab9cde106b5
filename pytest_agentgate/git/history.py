"""A repository's history: which commit a name means, what descends from what, and a
commit's message and patch as git prints them (with nothing of the repository's own
programs run: no external diff, no text conversion)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RevisionNotFound
from .place import Place


@dataclass(frozen=True)
class LogEntry:
    """One commit of a first-parent history walk."""

    commit: str
    tree: str
    author: str
    subject: str


class History:
    """The history of the repository at ``place``."""

    def __init__(self, place: Place) -> None:
        self.place = place

    def resolve(self, rev: str) -> str | None:
        """The commit ``rev`` names, or None; never treats ``rev`` as an option."""
        result = self.place.run(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
        )
        return result.out.strip() or None

    def resolve_commit(self, rev: str, source: str = "") -> str:
        """The commit ``rev`` names; :class:`RevisionNotFound` names the source otherwise."""
        if not rev or rev.startswith("-"):
            raise RevisionNotFound(rev, self.place.label, source)
        oid = self.resolve(rev)
        if oid is None:
            raise RevisionNotFound(rev, self.place.label, source)
        return oid

    def is_ancestor(self, commit: str, of: str) -> bool:
        """Whether ``commit`` is in the history of ``of`` (False when either is unknown)."""
        result = self.place.run("merge-base", "--is-ancestor", commit, of, ok=(0, 1, 128))
        return result.returncode == 0

    def first_parent_log(self, span: str) -> list[LogEntry]:
        """The commits of ``span`` (a revision or ``a..b``) along first parents, newest first."""
        out = self.place.run(
            "log", "--first-parent", "--format=%H%x00%T%x00%an%x00%s", "--end-of-options", span
        ).out
        return [LogEntry(*line.split("\0", 3)) for line in out.splitlines() if line]

    def first_parent_naming(self, span: str, text: str) -> list[str]:
        """The commits of ``span`` along first parents whose message holds ``text`` (a
        fixed string), newest first."""
        out = self.place.run(
            "log", "--first-parent", "--format=%H", "--fixed-strings", f"--grep={text}",
            "--end-of-options", span,
        ).out  # fmt: skip
        return out.split()

    def merge_base(self, a: str, b: str) -> str | None:
        """A best common ancestor of ``a`` and ``b`` in the history present, or None."""
        out = self.place.run("merge-base", "--end-of-options", a, b, ok=(0, 1))
        return out.out.strip() or None

    def parents(self, commit: str) -> list[str]:
        """The parents of ``commit``, in order."""
        out = self.place.run("rev-list", "--parents", "-n", "1", "--end-of-options", commit).out
        return out.split()[1:]

    def show_commit(self, commit: str) -> str:
        """A commit as a person reads it: header, whole message, stat and patch (no colour,
        no external diff or text conversion: nothing of the repository's runs)."""
        return self.place.run(
            "show", "--no-color", "--no-ext-diff", "--no-textconv", "--stat", "--patch",
            "--format=commit %H%nAuthor: %an <%ae>%nDate:   %aI%n%n%w(0,4,4)%B",
            "--end-of-options", commit,
        ).out  # fmt: skip

    def patch(self, old: str, new: str) -> str:
        """The patch from ``old`` to ``new`` (trees or commits), as git prints it, with
        nothing of the repository's run (no external diff, no text conversion)."""
        return self.place.run(
            "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--end-of-options", old, new
        ).out

    def first_parent_chain(self, rev: str, limit: int) -> list[tuple[str, list[str]]]:
        """Up to ``limit`` commits from ``rev`` back along first parents, each with its
        parents (one ``rev-list``)."""
        out = self.place.run(
            "rev-list", "--first-parent", "--parents", f"-n{limit}", "--end-of-options", rev
        ).out
        found = []
        for line in out.splitlines():
            commit, *parents = line.split()
            found.append((commit, parents))
        return found

    def is_commit(self, oid: str) -> bool:
        """Whether ``oid`` names a commit this repository has."""
        result = self.place.run("cat-file", "-t", "--end-of-options", oid, ok=(0, 1, 128))
        return result.returncode == 0 and result.out.strip() == "commit"

    def commit_message(self, commit: str) -> str:
        """A commit's message, whole."""
        return self.place.run("cat-file", "commit", commit).out.split("\n\n", 1)[-1]
