"""The only place that runs git.

Every git process the plugin starts goes through :func:`run`. It gets a scrubbed environment
(nothing inherited can redirect it to another repository, index or object store), safety
options that switch off everything a repository could use to run code (hooks, fsmonitor,
pagers, external diff), and an explicit ``--git-dir``: git never discovers a repository on
its own, so a ``.git`` an agent planted is never read. Failures raise :class:`GitError`
carrying the command, exit code and stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import GitError, GitTooOld, StaleLock

#: The oldest git with ``merge-tree --write-tree`` (the preflight).
MIN_GIT = (2, 38)

# Variables that make git read another repository, index, object store or configuration
# than the one we name...
_REDIRECTING = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_REPLACE_REF_BASE",
        "GIT_GRAFT_FILE",
        "GIT_SHALLOW_FILE",
        "GIT_QUARANTINE_PATH",
        "GIT_PREFIX",
    }
)
# ...and, for the plugin's own git processes, also anything that could run a program of
# the environment's choosing or change who a commit is by.
_SCRUBBED = _REDIRECTING | frozenset(
    {
        "GIT_CONFIG_NOSYSTEM",
        "GIT_CEILING_DIRECTORIES",
        "GIT_DISCOVERY_ACROSS_FILESYSTEM",
        "GIT_EXTERNAL_DIFF",
        "GIT_DIFF_OPTS",
        "GIT_PAGER",
        "PAGER",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_ASKPASS",
        "GIT_EXEC_PATH",
        "GIT_TEMPLATE_DIR",
        "GIT_REFLOG_ACTION",
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_AUTHOR_DATE",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "GIT_COMMITTER_DATE",
        "GIT_INTERNAL_SUPER_PREFIX",
    }
)
_SCRUBBED_PREFIXES = ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_", "GIT_TRACE")

# ``-c`` options on every run: no hooks, no fsmonitor daemon, no pager, no automatic gc while
# we hold objects that no ref names yet, and ctime checked so an agent cannot hide an edit by
# restoring a file's mtime.
_SAFETY = (
    "-c", f"core.hooksPath={os.devnull}",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "core.trustctime=true",
    "-c", "core.pager=cat",
    "-c", "safe.bareRepository=explicit",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "advice.detachedHead=false",
    "-c", "diff.external=",
    "-c", "protocol.file.allow=user",
)  # fmt: skip

#: Identity of the committer on every commit the plugin writes, unless the environment of
#: the calling process names one on purpose (``AGENTGATE_COMMITTER_NAME``/``_EMAIL``).
COMMITTER = ("agentgate", "agentgate@localhost")


def committer() -> tuple[str, str]:
    """The name and e-mail address every commit the plugin writes is committed by."""
    return (
        os.environ.get("AGENTGATE_COMMITTER_NAME", COMMITTER[0]),
        os.environ.get("AGENTGATE_COMMITTER_EMAIL", COMMITTER[1]),
    )


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The calling process's environment minus everything that could redirect git."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _SCRUBBED and not key.startswith(_SCRUBBED_PREFIXES)
    }
    env["GIT_NO_REPLACE_OBJECTS"] = "1"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["LC_ALL"] = "C"
    env["LANGUAGE"] = "C"
    env["GIT_COMMITTER_NAME"], env["GIT_COMMITTER_EMAIL"] = committer()
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class GitResult:
    """What a git run printed; ``out`` is stdout decoded with surrogateescape."""

    returncode: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Repository:
    """Which repository a git command works on, named explicitly: its git directory (None
    for the few commands that need none: ``version``, ``check-ref-format``, ``init``), and
    the working tree, index, directory git may trust and ``-c`` settings it runs with."""

    git_dir: Path | None
    work_tree: Path | None = None
    index: Path | None = None
    safe_directory: Path | None = None
    config: Sequence[str] = ()


#: A command that needs no repository (and must not find one above its working directory).
NO_REPOSITORY = Repository(None)


def run(
    args: Sequence[str],
    on: Repository,
    *,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    ok: Sequence[int] = (0,),
    cwd: Path | None = None,
) -> GitResult:
    """Run ``git <args>`` against the repository ``on`` names and return what it printed.

    Raises :class:`GitError` when the exit code is not in ``ok``.
    """
    git_dir, work_tree, index, safe_directory = (
        on.git_dir,
        on.work_tree,
        on.index,
        on.safe_directory,
    )
    config = on.config
    cmd: list[str] = ["git", *_SAFETY]
    for setting in config:
        cmd += ["-c", setting]
    if safe_directory is not None:
        cmd += ["-c", f"safe.directory={safe_directory}"]
    if git_dir is not None:
        cmd.append(f"--git-dir={git_dir}")
        if work_tree is not None:
            cmd.append(f"--work-tree={work_tree}")
    cmd += args
    extra = dict(env or {})
    if index is not None:
        extra["GIT_INDEX_FILE"] = str(index)
    if git_dir is None:
        # Commands without a repository must not find one above the working directory.
        extra.setdefault("GIT_CEILING_DIRECTORIES", str(Path(cwd or os.getcwd()).parent))
    # A session of its own: a Ctrl-C at the terminal reaches only the plugin, which holds it
    # while a ref and the files that follow it move (see _faults.uninterrupted). Anywhere
    # else the interrupt is passed on to git as SIGINT, and git is waited for, so it removes
    # its own lock files; it is never killed halfway.
    with subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=scrubbed_env(extra),
        cwd=cwd or git_dir or None,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(input)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
    result = GitResult(proc.returncode, stdout, stderr.decode("utf-8", "replace"))
    if proc.returncode not in ok:
        raise failure(args, proc.returncode, result.stderr)
    return result


_SYSCONFDIR: list[Path | None] = []


def sysconfdir() -> Path | None:
    """The folder git's build reads the system's configuration and attributes from (its
    ``sysconfdir``: ``/etc`` for a distribution's git, ``/usr/local/etc`` for one built
    with the default prefix), asked of git once a process: git names the file it would
    edit. None when git does not say, or ``GIT_CONFIG_SYSTEM`` hides it."""
    if not _SYSCONFDIR:
        found = None
        if "GIT_CONFIG_SYSTEM" not in os.environ:
            with contextlib.suppress(GitError, OSError):
                asked = Repository(None, config=("core.editor=echo",))
                out = run(["config", "--system", "--edit"], asked).out.strip()
                if out.startswith("/") and out.endswith("/gitconfig") and "\n" not in out:
                    found = Path(out).parent
        _SYSCONFDIR.append(found)
    return _SYSCONFDIR[0]


# -- what a failure was ------------------------------------------------------------------
#
# Every failure is classified here, once, from what git printed: the rest of the package
# asks ``held_lock`` and ``lost_race`` (or catches ``StaleLock``) and never reads stderr.

# How git says that another process holds (or a crashed one left) one of its lock files.
_LOCK_HELD = re.compile(r"Unable to create '([^']+\.lock)': File exists")
# How ``update-ref`` says that the old value did not match: somebody else moved the ref.
_LOST_RACE = ("but expected", "reference already exists", "unable to resolve reference")
# How git says that the disk, not the input, was the trouble.
_DISK_TROUBLE = re.compile(r"No space left on device|Input/output error|Disk quota exceeded")


def held_lock(stderr: str) -> str | None:
    """The lock file git found in its way (held now, or left by a crashed process), if any."""
    found = _LOCK_HELD.search(stderr)
    return found[1] if found else None


def lost_race(stderr: str) -> bool:
    """Whether a compare-and-swap ``update-ref`` failed because the ref was not at the old value."""
    return any(text in stderr for text in _LOST_RACE)


def disk_trouble(stderr: str) -> bool:
    """Whether git failed because the disk did (full, failing, over quota)."""
    return bool(_DISK_TROUBLE.search(stderr))


def failure(args: Sequence[str], returncode: int, stderr: str) -> GitError | StaleLock:
    """The error for a failed git run: :class:`StaleLock` when a lock was in the way."""
    lock = held_lock(stderr)
    if lock is not None:
        return StaleLock(lock)
    return GitError(list(args), returncode, stderr)


_version_cache: tuple[int, ...] | None = None


def version() -> tuple[int, ...]:
    """The installed git's version as a tuple, read once per process."""
    global _version_cache
    if _version_cache is None:
        text = run(["version"], NO_REPOSITORY, cwd=Path(os.sep)).out
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not match:
            raise GitError(["version"], 0, f"cannot read a version from {text!r}")
        _version_cache = tuple(int(part) for part in match.groups(default="0"))
    return _version_cache


def require_version(minimum: tuple[int, int] = MIN_GIT) -> None:
    """Raise :class:`GitTooOld` when the installed git predates ``minimum``."""
    found = version()
    if found[:2] < minimum:
        raise GitTooOld(".".join(map(str, found)), ".".join(map(str, minimum)))


def split_z(data: bytes) -> list[str]:
    """Split NUL-terminated git output into names (surrogateescape keeps any byte)."""
    return [part.decode("utf-8", "surrogateescape") for part in data.split(b"\0") if part]
