"""Folders hetbench writes into, checked for a symbolic link another user planted.

In a world-writable folder (/tmp), another local user can make `results` a link into a
folder of theirs, or make the suite's folder inside a shared results folder one: followed,
a run's records land where that user reads (and edits) them. The kernel refuses to follow
such links only where `fs.protected_symlinks` is 1, and only in sticky folders; hetbench
checks as if it were on everywhere: a link on the way that is neither the user's own nor
root's is refused. A user's own link (a results folder on another disk) is followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def foreign_link(path: Path) -> tuple[Path, int] | None:
    """The first symbolic link on the way to `path` (each existing component, as typed)
    owned by neither this user nor root, and its owner's uid; None where there is none."""
    mine = {os.geteuid(), 0}
    absolute = Path(os.path.abspath(path))
    for component in (*reversed(absolute.parents), absolute):
        try:
            info = os.lstat(component)
        except OSError:  # not there yet (hetbench makes it), or not ours to look at
            return None
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in mine:
            return component, info.st_uid
    return None


def refusal(link: Path, owner: int) -> str:
    """Why a folder through `link` is not written."""
    return (f"{link} is a symbolic link owned by another user (uid {owner}), not by you or "
            "root: refused, as it could send the results into a folder of theirs (name the "
            "folder it points to, if it is meant)")
