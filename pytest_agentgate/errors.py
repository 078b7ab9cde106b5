"""Exceptions the engine raises: small classes that carry the data a caller needs.

Every message says what was wrong and what to do about it; the attributes let a caller
(the plugin, the CLI, an orchestrator) react without parsing text.
"""

from __future__ import annotations

from collections.abc import Sequence


class AgentgateError(Exception):
    """Base class of every error pytest-agentgate raises on purpose."""


class GitError(AgentgateError):
    """A git command exited with a code the caller did not expect."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.args_run = tuple(args)
        self.returncode = returncode
        self.stderr = stderr
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
        super().__init__(f"git {' '.join(self.args_run)} exited {returncode}: {detail}")


class GitTooOld(AgentgateError):
    """The installed git lacks a feature the gate needs (``merge-tree --write-tree``)."""

    def __init__(self, found: str, needed: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f"git {found} is too old: pytest-agentgate needs git {needed} or newer "
            "(for 'git merge-tree --write-tree'); install a newer git"
        )


class ConfigError(AgentgateError):
    """A setting has a bad value; ``source`` names where it came from."""

    def __init__(self, message: str, *, value: object = None, source: str = "") -> None:
        self.value = value
        self.source = source
        where = f" (from {source})" if source else ""
        super().__init__(f"{message}{where}")


class SettingError(ConfigError):
    """A setting (``flag``, as the face that read it spells it) was given a value it cannot
    take; ``reason`` says why."""

    def __init__(self, flag: str, value: object, source: str, reason: str) -> None:
        self.flag = flag
        self.reason = reason
        super().__init__(f"invalid {flag} {value!r} (from {source}): {reason}", value=value)
        self.source = source


class RepoNotFound(ConfigError):
    """No git repository at the path the user named (``option``: how they name one)."""

    def __init__(self, path: object, source: str = "", option: str = "") -> None:
        self.option = option
        told = f" {option}" if option else ""
        super().__init__(
            f"no git repository at {str(path)!r}; name the repository the agents edit{told}",
            value=path,
            source=source,
        )


class RevisionNotFound(ConfigError):
    """A target branch or base revision that does not resolve to a commit."""

    def __init__(self, rev: str, repo: object, source: str = "") -> None:
        self.rev = rev
        super().__init__(
            f"{rev!r} does not name a commit in {str(repo)!r}; "
            "check the name with 'git branch -a' or 'git log --oneline'",
            value=rev,
            source=source,
        )


class BadRefName(ConfigError):
    """A branch or ref name git would refuse, or that could be taken for an option."""

    def __init__(self, name: str, source: str = "") -> None:
        self.name = name
        super().__init__(
            f"{name!r} is not a valid branch name (no leading '-', no '..', no spaces, "
            "no control characters)",
            value=name,
            source=source,
        )


class RefMoved(AgentgateError):
    """A compare-and-swap found the ref somewhere other than expected."""

    def __init__(self, ref: str, expected: str | None, actual: str | None) -> None:
        self.ref = ref
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{ref} is at {actual or '(missing)'}, not at the expected {expected or '(missing)'}; "
            "nothing was changed"
        )


class DirtyWorktree(AgentgateError):
    """The target is checked out with uncommitted changes to tracked files."""

    def __init__(self, worktree: object, paths: Sequence[str]) -> None:
        self.worktree = worktree
        self.paths = tuple(paths)
        shown = ", ".join(self.paths[:5]) + (" ..." if len(self.paths) > 5 else "")
        super().__init__(
            f"the target is checked out in {str(worktree)!r} with uncommitted changes to "
            f"tracked files ({shown}); commit or stash them, then run again. Nothing was moved"
        )


class WorktreeBlocked(AgentgateError):
    """Updating the checked-out target's files would overwrite files git does not track."""

    def __init__(self, worktree: object, detail: str, *, message: str | None = None) -> None:
        self.worktree = worktree
        self.detail = detail
        super().__init__(
            message
            or f"updating the checked-out target in {str(worktree)!r} would overwrite files: "
            f"{detail.strip()}; move them away, then run again. Nothing was moved"
        )


class MergeConflict(AgentgateError):
    """A three-way merge (preflight or revert) did not apply cleanly."""

    def __init__(self, paths: Sequence[str], what: str = "merge") -> None:
        self.paths = tuple(paths)
        super().__init__(f"{what} conflicts in: {', '.join(self.paths) or '(unknown paths)'}")


class RecordMismatch(ConfigError):
    """An attempt record that does not hold its own change: its Base trailer is not its
    parent (written by hand, or pushed to a server by anyone who can push)."""

    def __init__(self, ref: str, base: str, parents: Sequence[str]) -> None:
        self.ref, self.base, self.parents = ref, base, tuple(parents)
        super().__init__(
            f"{ref} does not hold its own change: its Base trailer is not its parent (a "
            "record written by hand?); nothing was changed",
            value=ref,
        )


class AttemptNotFound(ConfigError):
    """An attempt name that matches no attempt, or more than one (a value that does not resolve)."""

    def __init__(self, name: str, matches: Sequence[str] = ()) -> None:
        self.matches = tuple(matches)
        if matches:
            shown = ", ".join(matches[:4]) + (", ..." if len(matches) > 4 else "")
            msg = f"{name!r} matches {len(matches)} attempts ({shown}); be more specific"
        else:
            msg = f"no attempt matches {name!r}; list them with 'agentgate attempts'"
        super().__init__(msg, value=name)
        self.name = name


class StaleLock(AgentgateError):
    """git left a ``*.lock`` file behind; the user decides whether it is stale."""

    def __init__(self, path: object) -> None:
        self.path = path
        super().__init__(
            f"git lock file {str(path)!r} exists: another git process is running, or one "
            f"crashed. If no git process is running on this repository, remove it with: rm {str(path)!r}"
        )


class NothingToRollBack(AgentgateError):
    """The target already has the tree a rollback would give it."""

    def __init__(self, ref: str, tree: str) -> None:
        self.ref = ref
        self.tree = tree
        super().__init__(
            f"{ref} already has tree {tree}; nothing to roll back, nothing was changed"
        )


class NothingToRevert(AgentgateError):
    """Reverting the attempt would leave the target's tree as it is."""

    def __init__(self, attempt: str) -> None:
        self.attempt = attempt
        super().__init__(f"reverting {attempt} changes nothing on the target; it is already undone")


class GateFailed(AgentgateError):
    """A gate run outside a test (a revert's gate, a re-test) rejected the tree."""

    def __init__(self, reason: str, output: str = "") -> None:
        self.reason = reason
        self.output = output
        super().__init__(reason + (f"\n{output}" if output else ""))


class PushRefused(AgentgateError):
    """The server refused a push on policy (a hook, a protected branch): not a race."""

    def __init__(self, target: str, reason: str) -> None:
        self.target = target
        self.reason = reason
        super().__init__(f"the server refused the push to {target}: {reason}")


class NotNeeded(Exception):
    """While it waited for the server's lease, whoever waited found it need not hold it
    (nothing left to lead, or a fast-forward that is better queued)."""


class StateError(AgentgateError):
    """A declared state path that cannot be captured or restored."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"state {str(path)!r}: {reason}")
