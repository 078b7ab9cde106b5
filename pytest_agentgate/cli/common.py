"""What the ``agentgate`` subcommands share: exit codes, the usage error, and how each
finds its repository, its branch and the records it reads."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.options import Option
    from ..engine.resolving import Resolved
    from ..git.repo import Author, BaseRepo
    from ..land.remote_branch import RemoteBranch

#: The command line itself is wrong: a flag's value names nothing, or flags that need each
#: other are not given together.
EXIT_USAGE = 2
#: The command line is right, and what it asks is refused as the repository (or the
#: folder it names) is now: nothing was changed.
EXIT_REFUSED = 1


class UsageProblem(Exception):
    """A bad argument value (exit code 2)."""


class Refused(Exception):
    """What was asked cannot be done to what it names as things are (exit code 1)."""


def open_repo(args: argparse.Namespace) -> BaseRepo:
    """The repository, with whatever moves a killed or failing run left unrecorded settled."""
    from ..git.repo import BaseRepo
    from ..store.pending import settle_all

    repo = BaseRepo.open(args.repo, "--repo", "with --repo PATH")
    for note in settle_all(repo):
        print(f"agentgate: {note}", file=sys.stderr)
    return repo


def target_branch(repo: BaseRepo, args: argparse.Namespace) -> str:
    from ..errors import ConfigError
    from ..git.repo import check_branch_name

    branch = args.target or repo.refs.head_branch()
    if not branch:
        raise UsageProblem("no branch is checked out; name one with --target BRANCH")
    check_branch_name(branch, "--target")
    if repo.refs.value(f"refs/heads/{branch}") is None:
        raise ConfigError(
            f"branch {branch!r} does not exist in {repo.label}", value=branch, source="--target"
        )
    return str(branch)


def moved_branch(repo: BaseRepo, args: argparse.Namespace) -> tuple[str, RemoteBranch | None]:
    """The branch a rollback or revert moves: here, or with ``--remote`` on that server
    (fetched now, so that its history is here to read)."""
    if not args.remote:
        return target_branch(repo, args), None
    from ..errors import ConfigError
    from ..git.repo import check_branch_name
    from ..land.remote_branch import RemoteBranch
    from ..store.oplog import OpLog

    branch = args.target or repo.refs.head_branch()
    if not branch:
        raise UsageProblem("no branch is checked out; name one with --target BRANCH")
    check_branch_name(branch, "--target")
    target = RemoteBranch(repo, args.remote, branch, OpLog(repo.common_dir))
    target.check("--remote")
    if target.tip() is None:
        raise ConfigError(
            f"branch {branch!r} does not exist on remote {args.remote!r}",
            value=branch,
            source="--target",
        )
    return branch, target


def expected_old(repo: BaseRepo, args: argparse.Namespace) -> str | None:
    return repo.history.resolve_commit(args.expect, "--expect") if args.expect else None


def author_of(agent: str) -> Author:
    from ..git.repo import Author

    return Author.for_agent(agent)


#: The ref moved, but the checked-out files did not follow (yet): not an error, not done.
EXIT_FILES_LAG = 3


def files_lagging(args: argparse.Namespace, problem: str) -> int:
    print(f"agentgate {args.command}: warning: the branch moved, but {problem}", file=sys.stderr)
    return EXIT_FILES_LAG


# -- subcommands ------------------------------------------------------------------------


def records_ref(repo: BaseRepo, args: argparse.Namespace, *, with_state: bool = False) -> str:
    """Where the records to read are: this clone's, or with ``--remote`` the server's,
    fetched now."""
    from ..remote import server_records
    from ..store.attempts import PREFIX

    if not getattr(args, "remote", None):
        return PREFIX
    server = server_records.for_remote(repo, args.remote)
    return server_records.fetch_records(repo, server, with_state=with_state)


def add_settings(
    parser: argparse.ArgumentParser, *names: str, notes: Mapping[str, str] | None = None
) -> None:
    """Settings of the option table as this command's arguments (``--<name>``: the
    plugin's flag without its prefix), each with its declared kind and help (``notes``: what
    the command adds to it); their values are read by :func:`settings_of`."""
    from ..engine.options import BY_NAME

    for name in names:
        option = BY_NAME[name]
        said = f"{option.help} (as {option.flag})" + (
            f"; {notes[name]}" if notes and name in notes else ""
        )
        if option.kind == "bool":
            parser.add_argument(
                cli_flag(option), action="store_true", default=None, dest=name, help=said
            )
            continue
        parser.add_argument(
            cli_flag(option),
            action="append" if option.kind == "linelist" else "store",
            default=None,
            dest=name,
            metavar=option.metavar,
            help=said,
        )


def cli_flag(option: Option) -> str:
    return "--" + option.name.replace("_", "-")


def settings_of(args: argparse.Namespace, *names: str) -> Resolved:
    """The settings :func:`add_settings` added, resolved through their declarations: the
    command line over the environment (a setting that has a variable), as in the plugin."""
    from ..engine.options import BY_NAME
    from ..engine.resolving import first_given, resolve
    from ..errors import ConfigError

    given = {}
    for name in names:
        found = first_given(BY_NAME[name], getattr(args, name), cli_flag(BY_NAME[name]))
        if found is not None:
            given[name] = found
    try:
        return resolve(given, spelled=cli_flag)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None
