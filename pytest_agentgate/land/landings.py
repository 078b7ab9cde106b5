"""The commit a passing attempt lands as, in the shape the project keeps its history in
(``--agentgate-land``), and how to tell later that a commit on the target landed it.

- ``merge`` (the default): onto its own base, the attempt's commit itself (a fast-forward);
  onto a tip that moved, a merge commit of the two.
- ``squash``: always one new commit on the tip, the task its subject, the agent its author,
  and trailers that find its record and name the attempt's commit (``Agentgate-Squashed``).
- ``rebase``: the attempt's commit replayed on the tip, its message and author kept, with
  one trailer naming the commit it replays (``Agentgate-Rebased``), the way ``git
  cherry-pick -x`` does; onto its own base it is the commit itself.

Whatever the shape, the tree that lands is the merge of the tip and the attempt (the one
the queue re-tests), so rollback, revert and audit, which work on trees, treat all three
alike. Only the question "did this change land?" needs the trailers: a squashed or
rebased commit does not have the attempt's commit as an ancestor.
"""

from __future__ import annotations

from typing import NamedTuple

from ..git.repo import Author, BaseRepo
from ..store import records
from ..store.record import Record


class Landed(NamedTuple):
    """The commit that lands an attempt, its tree, and the kind of move it makes."""

    commit: str
    tree: str
    #: fast-forward, merge, squash, rebase
    kind: str


def landing_commit(
    repo: BaseRepo, head: str, change_commit: str, tree: str, record: Record
) -> Landed:
    """The commit that lands ``change_commit`` (made on ``record.base``) on ``head``, with
    ``tree`` (the merge of the two, already checked free of conflicts)."""
    author = Author.for_agent(record.agent)
    if record.landing == "squash":
        message = records.squash_message(record, change_commit)
        return Landed(repo.commit_tree(tree, [head], message, author), tree, "squash")
    if head == record.base:
        return Landed(change_commit, tree, "fast-forward")
    if record.landing == "rebase":
        message = records.rebased_message(repo.history.commit_message(change_commit), change_commit)
        return Landed(repo.commit_tree(tree, [head], message, author), tree, "rebase")
    message = records.merge_message(record.task, record.agent)
    return Landed(repo.commit_tree(tree, [head, change_commit], message, author), tree, "merge")


def judged_as_is(head: str, base: str, kind: str) -> bool:
    """Whether a landing's tree is exactly the attempt's own (its gate judged it, so no
    re-test is needed): a fast-forward, or a squash made on the attempt's own base."""
    return kind == "fast-forward" or (kind == "squash" and head == base)


def change_landed(repo: BaseRepo, change_commit: str, base: str, tip: str) -> str | None:
    """The commit of ``base..tip`` (first parents) that landed ``change_commit``, in any of
    the three shapes; None when none did."""
    if repo.history.is_ancestor(change_commit, tip):
        return change_commit
    for commit in repo.history.first_parent_naming(f"{base}..{tip}", change_commit):
        if lands(repo, commit, change_commit):
            return commit
    return None


def lands(repo: BaseRepo, commit: str, change_commit: str) -> bool:
    """Whether ``commit`` holds ``change_commit``'s landing: has it as an ancestor, or (a
    squash, a rebase) names it in its trailer *and* is its parent merged with it, tree for
    tree (anyone who can push can write a trailer; only the plugin's landing has that
    tree)."""
    if repo.history.is_ancestor(change_commit, commit):
        return True
    if records.landing_said(repo.history.commit_message(commit)).replays != change_commit:
        return False
    parents = repo.history.parents(commit)
    if len(parents) != 1:
        return False
    preview = repo.merge_preview(parents[0], change_commit)
    return not preview.conflicts and preview.tree == repo.tree_of(commit)
