"""Publishing a staged model directory without ever losing the previous one (docs/container.md
section 8, docs/cli.md "What --force touches").

The steps live in modules of one job each, and this module names them all (``__all__``):
:mod:`.lock` (:class:`OutputLock`, one writer per output), :mod:`.destination`
(:func:`check_destination`: what may be at the output and what ``--force`` may delete),
:mod:`.resources` (:func:`resource_error`, :func:`check_free_space`, :func:`check_writable`),
:mod:`.owner` (the owner record of a lock or staging folder), :mod:`.renames` (the atomic
renames and directory fsync) and :mod:`.interrupts` (:class:`Interrupted`,
:func:`deferred_signals`).  This module holds the staging area and its recovery.

Contract:

* :class:`StagingArea` is the hidden folder ``.<name>.ninfer-staging-<hex>`` beside the output:
  ``owner.json`` (pid, process start marker, boot id, host), ``new/`` (the artifact being
  written) and, in the fallback publish only, ``old/`` (the previous output, moved aside).
* :meth:`StagingArea.publish` puts ``new/`` at the output.  Where Linux ``renameat2`` is
  reachable it is one atomic ``RENAME_EXCHANGE`` (or ``RENAME_NOREPLACE`` when nothing is
  there), so the output name always holds the old or the new artifact.  Elsewhere: output ->
  ``old/``, ``new/`` -> output.  The commit point is the parent-directory fsync after that; a
  failure or interrupt before it undoes the renames (the previous state is back), after it the
  old artifact's named files are deleted and nothing else.  SIGINT, SIGTERM and SIGHUP are held
  back for the few renames and delivered right after (:func:`deferred_signals`).
* :func:`recover_stale` (run with the lock held) looks at staging folders of the same output left
  by a dead process (pid gone, or reused: its start marker differs, or another boot): one whose
  ``old/`` is the only copy of the previous output (the output name is missing) is renamed back
  ("restored"); any other is deleted ("removed").  Folders of live processes, of another host, or
  without an owner record (older versions) are left alone and reported.  Legacy
  ``.<name>.ninfer-old-<hex>`` folders are renamed back when the output name is missing.

Test hooks (environment): ``NINFER_TEST_PAUSE_AT=<point>`` pauses at a named step
(:func:`ninfer_convert._startup.pause_point`; the points are ``startup``, ``staging`` after each
tensor, ``commit``, ``publish`` before the first rename, ``moved-aside`` between the fallback's
two renames, ``published`` after the new artifact is in place); ``NINFER_TEST_NO_EXCHANGE=1``
forces the fallback publish (:mod:`.renames`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
from pathlib import Path

from .._startup import pause_point
from .destination import Destination, check_destination
from .interrupts import Interrupted, deferred_signals
from .lock import OutputLock
from .owner import _alive, _read_owner, owner_record
from .renames import exchange, fsync_dir, rename_noreplace
from .resources import check_free_space, check_writable, disk_free, resource_error

__all__ = [
    "Destination",
    "Interrupted",
    "OutputLock",
    "StagingArea",
    "check_destination",
    "check_free_space",
    "check_writable",
    "deferred_signals",
    "disk_free",
    "fsync_dir",
    "pause_point",
    "recover_stale",
    "resource_error",
]

STAGING_INFIX = ".ninfer-staging-"
LEGACY_OLD_INFIX = ".ninfer-old-"
OWNER_NAME = "owner.json"
NEW_NAME = "new"
OLD_NAME = "old"


def _is_ours(name: str, out_name: str, infix: str) -> bool:
    prefix = f".{out_name}{infix}"
    return (
        name.startswith(prefix) and re.fullmatch(r"[0-9a-f]{12}", name[len(prefix) :]) is not None
    )


class StagingArea:
    """``.<name>.ninfer-staging-<hex>/{owner.json,new/}`` beside the output."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out.parent / f".{out.name}{STAGING_INFIX}{secrets.token_hex(6)}"
        self.new = self.root / NEW_NAME
        self.old = self.root / OLD_NAME
        self.notes: list[str] = []
        self._replaced: Path | None = None  # where the previous output went
        self.root.mkdir()
        try:
            (self.root / OWNER_NAME).write_text(json.dumps(owner_record()))
            self.new.mkdir()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def publish(self, dest: Destination) -> None:
        """Put ``new/`` at the output over ``dest`` (re-checked by the caller just before);
        on any failure before the commit point (the parent fsync after the last rename) the
        previous state is restored and the error re-raised.  Then call :meth:`finish`.  Call
        both inside :func:`deferred_signals`, once ``new/`` is complete and fsynced."""
        out, parent = self.out, self.out.parent
        if dest.kind == "absent":
            pause_point("publish")
            rename_noreplace(self.new, out)
            try:
                pause_point("published")
                fsync_dir(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(out, self.new)
                raise
            return
        pause_point("publish")
        if exchange(self.new, out):
            try:
                pause_point("published")
                fsync_dir(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    exchange(self.new, out)
                raise
            self._replaced = self.new
            return
        # Fallback without an atomic exchange: the output name is missing between the two
        # renames; recover_stale() renames old/ back if the process dies there.
        os.rename(out, self.old)
        try:
            pause_point("moved-aside")
            os.rename(self.new, out)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(self.old, out)
            raise
        try:
            pause_point("published")
            fsync_dir(parent)
            fsync_dir(self.root)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(out, self.new)
                os.rename(self.old, out)
            raise
        self._replaced = self.old

    def finish(self, dest: Destination) -> None:
        """After the commit point: delete the replaced artifact's named files (nothing else)
        and the staging area.  Failures become :attr:`notes`; the new artifact stays."""
        old = self._replaced
        if old is None:
            self._cleanup_root()
            return
        try:
            for rel in dest.files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old / rel)
            folders = sorted(
                {
                    p
                    for rel in dest.files
                    for p in (old / rel).parents
                    if p != old and p.is_relative_to(old)
                },
                key=lambda p: len(p.parts),
                reverse=True,
            )
            for folder in folders:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(folder)
            os.rmdir(old)
        except OSError as exc:
            # The new artifact is published; only the clean-up failed.
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                self._keep(f"files the tool did not make appeared in the old output ({exc})")
            else:  # the owner record stays: a later run removes the folder
                self.notes.append(
                    f"could not remove the previous artifact in {self.root} ({exc}); "
                    "the next convert to this output removes it"
                )
            return
        self._cleanup_root()

    def _cleanup_root(self) -> None:
        try:
            os.unlink(self.root / OWNER_NAME)
            os.rmdir(self.root)
        except OSError as exc:
            if os.path.exists(self.root / OWNER_NAME):
                self.notes.append(
                    f"could not remove the staging folder {self.root} ({exc}); "
                    "the next convert to this output removes it"
                )
            else:
                self._keep(f"the staging folder could not be removed ({exc})")

    def _keep(self, why: str) -> None:
        # Without its owner record a later run leaves the folder alone: it may hold files
        # the tool did not make (added to the old output while we were writing).
        with contextlib.suppress(OSError):
            os.unlink(self.root / OWNER_NAME)
        self.notes.append(f"kept {self.root}: {why}; remove it by hand")

    def discard(self) -> None:
        """Remove the staging area (abort)."""
        shutil.rmtree(self.root, ignore_errors=True)


def recover_stale(out: Path) -> list[str]:
    """Restore or remove what dead writers of ``out`` left beside it (hold the lock first);
    returns one line per folder found."""
    parent = out.parent
    notes: list[str] = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return notes
    for name in names:
        folder = parent / name
        if _is_ours(name, out.name, STAGING_INFIX) and folder.is_dir() and not folder.is_symlink():
            note = _recover_area(out, folder)
        elif (
            _is_ours(name, out.name, LEGACY_OLD_INFIX)
            and folder.is_dir()
            and not folder.is_symlink()
        ):
            if os.path.lexists(out):
                note = f"left {folder} alone: an older ninfer's moved-aside output; {out} exists"
            else:
                os.rename(folder, out)
                fsync_dir(parent)
                note = f"restored {out} from {folder} (left by an interrupted --force)"
        else:
            continue
        if note:
            notes.append(note)
    return notes


def _recover_area(out: Path, folder: Path) -> str | None:
    owner = _read_owner(folder / OWNER_NAME)
    if owner is None:
        try:
            os.rmdir(folder)  # died between creating the folder and writing its record
        except OSError:
            return (
                f"left {folder} alone: it has no owner record (made by an older ninfer?); "
                "remove it by hand if no convert is running"
            )
        return None
    pid = owner.get("pid")
    alive = _alive(owner)
    if alive is None:
        return f"left {folder} alone: cannot tell whether its writer (pid {pid}) still runs"
    if alive:
        return f"left {folder} alone: its writer (pid {pid}) is still running"
    old = folder / OLD_NAME
    if old.is_dir() and not os.path.lexists(out):
        os.rename(old, out)
        fsync_dir(out.parent)
        shutil.rmtree(folder, ignore_errors=True)
        return f"restored {out} from {folder} (pid {pid} died while publishing)"
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        return f"could not remove {folder} left by dead pid {pid}; remove it by hand"
    return f"removed {folder} left by pid {pid}, which died before finishing"
