"""A repository's refs: what each name points at, and moving a name. A ref only moves
through :meth:`Refs.update`, which always passes the old value, so a lost race is reported
as ``False`` and never overwrites someone else's move. Loose refs are read from their files
(and, where git would write the same bytes, written through :mod:`.ref_files`); anything
else is git's to answer."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import BadRefName
from . import objects, ref_files
from . import runner as _git
from .objects import is_oid
from .place import Place

ZERO = "0" * 40

_PLAIN_REF, _ODD_REF = ref_files.PLAIN_REF, ref_files.ODD_REF


def check_branch_name(name: str, source: str = "") -> str:
    """Return ``name`` if git accepts it as a branch name, else raise :class:`BadRefName`."""
    if (
        not name
        or name.startswith("-")
        or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
        raise BadRefName(name, source)
    result = _git.run(
        ["check-ref-format", "--branch", name], _git.NO_REPOSITORY, ok=(0, 1, 128), cwd=Path("/")
    )
    if result.returncode != 0:
        raise BadRefName(name, source)
    return name


class Refs:
    """The refs of the repository at ``place``."""

    def __init__(self, place: Place) -> None:
        self.place = place

    def value(self, ref: str) -> str | None:
        """What a full ref name points at, or None when it does not exist.

        A loose ref is read from its file, as git reads it (git replaces the file whole,
        by rename, so a reader never sees half of one): a git process less on every fork,
        preflight and record. Anything else (packed, symbolic, a reftable repository) is
        git's to answer.
        """
        found = self._loose(ref)
        if found is not None:
            return found
        result = self.place.run(
            "rev-parse", "--verify", "--quiet", "--end-of-options", ref, ok=(0, 1)
        )
        return result.out.strip() or None

    def _loose(self, ref: str) -> str | None:
        if self.place.reftable or not _PLAIN_REF.match(ref) or _ODD_REF.search(ref):
            return None
        try:
            fd = os.open(self.place.common_dir / ref, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 100)
        except OSError:
            return None
        finally:
            os.close(fd)
        text = data.decode("ascii", "replace").strip()
        valid = data.endswith(b"\n") and is_oid(text) and len(text) == self.place.oid_length
        return text if valid else None

    def names(self, prefix: str) -> list[str]:
        """The names of the refs under ``prefix`` (a folder: ends with ``/``), loose and
        packed, read from git's files; from ``for-each-ref`` in a reftable repository.

        For guesses that a compare-and-swap then checks (the next free attempt number): a
        ref created meanwhile only makes the swap fail and the guess move on.
        """
        parts = prefix.rstrip("/").split("/")
        if any(part in ("", ".", "..") or part.endswith(".lock") for part in parts):
            return []  # no ref has such a name: never a walk outside the refs
        if self.place.reftable or not prefix.endswith("/") or not _PLAIN_REF.match(prefix + "x"):
            return [row[0] for row in self.rows(prefix)]
        common = self.place.common_dir
        names: set[str] = set()
        for dirpath, _dirs, files in os.walk(common / prefix):
            rel = Path(dirpath).relative_to(common).as_posix()
            names.update(f"{rel}/{name}" for name in files if not name.endswith(".lock"))
        try:
            with open(common / "packed-refs", "rb") as packed:
                for line in packed:
                    if line[:1] in (b"#", b"^"):
                        continue
                    name = line.rstrip(b"\n").partition(b" ")[2].decode("utf-8", "surrogateescape")
                    if name.startswith(prefix):
                        names.add(name)
        except OSError:
            pass
        return sorted(names)

    def head_branch(self) -> str | None:
        """The branch HEAD points at (short name), or None when detached.

        HEAD is always a plain file in the git directory; reading it spares a git process on
        every promotion. Anything unusual in it is left to git to interpret.
        """
        try:
            text = (self.place.git_dir / "HEAD").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        if text.startswith("ref: refs/heads/") and "\n" not in text:
            return text[len("ref: refs/heads/") :]
        if is_oid(text):
            return None
        result = self.place.run("symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
        return result.out.strip() or None

    def last_reflog_entry(self, ref: str) -> tuple[str, str] | None:
        """The newest reflog entry of ``ref`` as (new id, message), read from its file."""
        where = self.place.git_dir if ref == "HEAD" else self.place.common_dir
        try:
            with open(where / "logs" / ref, "rb") as log:
                log.seek(0, 2)
                log.seek(max(0, log.tell() - 4096))
                lines = log.read().splitlines()
        except OSError:
            return None
        if not lines:
            return None
        head, _, message = lines[-1].decode("utf-8", "replace").partition("\t")
        fields = head.split(" ")
        return (fields[1], message) if len(fields) > 1 else None

    def rows(self, prefix: str, fmt: str = "%(refname)%00%(objectname)") -> list[list[str]]:
        """Rows of ``for-each-ref`` under ``prefix``, fields split on NUL."""
        out = self.place.run("for-each-ref", f"--format={fmt}", "--end-of-options", prefix).out
        return [line.split("\0") for line in out.splitlines() if line]

    def records(self, prefix: str, fields: Sequence[str]) -> list[list[str]]:
        """``for-each-ref`` under ``prefix``, newest first: one list of ``fields`` per ref.

        Records are split on a byte no field holds, so a multi-line field (a commit's
        trailers) stays whole.
        """
        fmt = "%00".join(f"%({name})" for name in fields) + "%01"
        out = self.place.run(
            "for-each-ref", "--sort=-creatordate", f"--format={fmt}", "--end-of-options", prefix
        ).out
        found = []
        for chunk in out.split("\x01"):
            parts = chunk.strip("\n").split("\0")
            if len(parts) >= len(fields):
                found.append(parts[: len(fields)])
        return found

    def branch_containing(self, commit: str, prefix: str = "refs/heads/") -> str | None:
        """A branch (its name below ``prefix``) whose history contains ``commit``, or None."""
        out = self.place.run(
            "for-each-ref", "--count=1", "--format=%(refname)", f"--contains={commit}",
            prefix, ok=(0, 129),
        ).out.strip()  # fmt: skip
        return out[len(prefix) :] if out else None

    def update(
        self, ref: str, new: str, old: str | None, message: str, *, reflog: bool = False
    ) -> bool:
        """Move ``ref`` from ``old`` (None: must not exist) to ``new``; False if it moved.

        A stale lock raises :class:`StaleLock`; any other failure :class:`GitError`.
        """
        place = self.place
        whole = not place.reftable and len(new) == place.oid_length
        if old is None and not reflog and whole:
            created = ref_files.create(place.common_dir, place.git_dir, ref, new, message)
            if created is not None:
                return created
        if old is not None and reflog and whole and len(old) == place.oid_length:
            by = _reflog_identity()
            moved = by and ref_files.update(
                place.common_dir, place.git_dir, ref, new, old, message, by
            )
            if moved:
                return True
        args = ["update-ref"]
        if reflog:
            args.append("--create-reflog")
        args += ["-m", message, "--end-of-options", ref, new, old or place.null_oid]
        result = place.run(*args, ok=(0, 1, 128))
        if result.returncode == 0:
            return True
        if _git.held_lock(result.stderr) is None and _git.lost_race(result.stderr):
            return False
        raise _git.failure(args, result.returncode, result.stderr)

    def delete(self, ref: str, old: str, message: str = "agentgate prune") -> bool:
        """Delete ``ref`` if it is still at ``old``; False when it was not."""
        result = self.place.run(
            "update-ref", "-m", message, "-d", "--end-of-options", ref, old, ok=(0, 1, 128)
        )
        return result.returncode == 0


def _reflog_identity() -> bytes:
    """Who moves a ref and when, as git writes it in a reflog line; empty when git would
    write the name otherwise (see :func:`.objects.clean_identity`)."""
    name, email = _git.committer()
    if not (objects.clean_identity(name) and objects.clean_identity(email)):
        return b""
    when = objects.now()
    try:
        return objects.identity(name, email, when, objects.zone_offset(when))
    except UnicodeEncodeError:
        return b""  # bytes that are not UTF-8: git's to write as they are
