"""A target that lives on a remote: the server's compare-and-swap is the one that counts.

When the base repository is a clone and the branch that matters is on a server (a bare
repository, ``git daemon``, a forge), promotion is a push with a lease:
``git push --atomic --force-with-lease=refs/heads/<b>:<expected> <remote> <new>:refs/heads/<b>``.
The server moves the branch only if it is still where this process last saw it, so clones on
different machines (or pytest-xdist workers) can never overwrite each other's promotions. The
local lock still orders this machine's own writers; what the server holds is read with a fetch
into ``refs/agentgate/remote/<remote>/<branch>``, never into the user's remote-tracking refs.
"""

from __future__ import annotations

from .errors import ConfigError, GitError
from .repo import BaseRepo

PREFIX = "refs/agentgate/remote/"
# How push says the lease (our compare-and-swap) did not hold: a lost race, not a failure.
_LOST_RACE = ("stale info", "fetch first", "non-fast-forward", "rejected")


class RemoteTarget:
    """One branch on one remote, seen through a tracking ref the plugin owns."""

    def __init__(self, repo: BaseRepo, remote: str, branch: str) -> None:
        self.repo = repo
        self.remote = remote
        self.branch = branch
        self.tracking = f"{PREFIX}{remote}/{branch}"
        self._urls: tuple[str, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.remote}/{self.branch}"

    def check(self, source: str = "") -> None:
        """Raise :class:`ConfigError` unless ``remote`` is a configured remote of the base."""
        if not self.remote or self.remote.startswith("-") or "/" in self.remote:
            raise ConfigError(
                f"{self.remote!r} is not a remote name", value=self.remote, source=source
            )
        url = self.repo.git("config", "--get", f"remote.{self.remote}.url", ok=(0, 1)).out.strip()
        if not url:
            raise ConfigError(
                f"{self.repo.label} has no remote named {self.remote!r}; add it with "
                f"'git remote add {self.remote} URL'",
                value=self.remote,
                source=source,
            )

    def urls(self) -> tuple[str, str]:
        """(fetch URL, push URL) of the remote, as git resolves them (``insteadOf`` included).

        Fetching from and pushing to the URL, not the remote's name, keeps git from updating
        the user's ``refs/remotes/<remote>/*`` on the side: the plugin moves only its own refs.
        """
        if self._urls is None:
            fetch = self.repo.git("remote", "get-url", "--end-of-options", self.remote).out.strip()
            push = self.repo.git(
                "remote", "get-url", "--push", "--end-of-options", self.remote
            ).out.strip()
            self._urls = (fetch, push)
        return self._urls

    def fetch(self) -> str | None:
        """The branch's tip on the server now (also stored in the tracking ref), or None."""
        result = self.repo.git(
            "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
            "--end-of-options", self.urls()[0], f"+refs/heads/{self.branch}:{self.tracking}",
            ok=(0, 128),
        )  # fmt: skip
        if result.returncode != 0:
            if "couldn't find remote ref" in result.stderr:
                return None
            raise GitError(["fetch", self.remote], result.returncode, result.stderr)
        return self.repo.ref_value(self.tracking)

    def push(self, new: str, expected: str, message: str) -> bool:
        """Move the server's branch from ``expected`` to ``new``; False if it had moved."""
        result = self.repo.git(
            "push", "--quiet", "--porcelain", "--atomic", "--no-verify",
            f"--force-with-lease=refs/heads/{self.branch}:{expected}",
            "--end-of-options", self.urls()[1], f"{new}:refs/heads/{self.branch}",
            ok=(0, 1, 128),
        )  # fmt: skip
        if result.returncode == 0:
            # Our own view follows; a compare-and-swap, like every ref the plugin moves.
            self.repo.update_ref(self.tracking, new, expected, message)
            return True
        text = result.out + result.stderr
        if any(lost in text for lost in _LOST_RACE):
            return False
        raise GitError(["push", self.remote], result.returncode, text)
