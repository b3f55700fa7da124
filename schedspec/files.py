"""Files in and out, the same careful way for every command and loader.

In: read_input_text reads a regular file (or a pipe, giving up on one that delivers
nothing for PIPE_WAIT_SECONDS: a FIFO nobody writes to) of at most a stated size and
decodes it as UTF-8; parse_json parses it, refusing what the standard library would
take but a loader cannot use (NaN, Infinity, nesting past MAX_JSON_DEPTH). Every
refusal is an InputFileError naming the file and saying what is wrong with it: a
binary or UTF-16 file, a folder, /dev/zero, a gigabyte, a thousand nested lists.

Out: write_atomically writes a sibling temporary file, flushes it to disk and renames
it over the target, so a reader (a CI job, the next run) sees the old file or the new
one, never half of one, even when the disk fills. The new file gets the mode a plain
open() would give it (0644 under a umask of 022), or the mode of the file it replaces.
Only a regular file (or nothing) may stand at an output path: a device, a FIFO, a socket
or a folder there is refused, never replaced (as root, `--json /dev/null` would
otherwise turn the system's device into a file); a symbolic link is followed, so the
file it names is replaced and the link kept. Nothing is ever unlinked but schedspec's
own temporary file. prepare_output_dir and prepare_output_file check before a run
starts that its outputs can be written, so a finding is never lost to a bad path at
the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import stat
import tempfile
from pathlib import Path
from typing import Any

# Deeper than any file schedspec reads or writes (a trace: document, events, an event,
# its map of counts) by far, and shallow enough that no loader recurses into trouble.
MAX_JSON_DEPTH = 32

_BOMS = {
    b"\xff\xfe": "UTF-16 (little-endian)",
    b"\xfe\xff": "UTF-16 (big-endian)",
}


class InputFileError(ValueError):
    """An input file that cannot be read as what it should be; the message names it."""

    def __init__(self, path: Path | str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = str(path)
        self.detail = detail


class OutputPathError(OSError, ValueError):
    """An output path that cannot be written; the message names it and why. An OSError
    too, so that a writer that turns a failed write into a warning (a report, a trace)
    treats a path refused at the end like a full disk."""

    def __init__(self, path: Path | str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = str(path)
        self.detail = detail


# --------------------------------------------------------------------------- in


def read_input_text(path: Path, max_bytes: int) -> str:
    """The file's text: a regular file or a pipe, at most max_bytes, UTF-8 (a leading
    byte-order mark is dropped). Anything else is an InputFileError."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        raise InputFileError(path, f"cannot be read: {err.strerror or err}") from None
    if stat.S_ISDIR(mode):
        raise InputFileError(path, "is a folder, not a file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise InputFileError(path, "is not a regular file (a device or a socket?)")
    try:
        if stat.S_ISFIFO(mode):
            data = _read_pipe(path, max_bytes + 1)
        else:
            with path.open("rb") as stream:
                data = stream.read(max_bytes + 1)
    except OSError as err:
        raise InputFileError(path, f"cannot be read: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise InputFileError(path, f"is larger than the {max_bytes:,} bytes this input may be")
    for bom, encoding in _BOMS.items():
        if data.startswith(bom):
            raise InputFileError(path, f"is {encoding} text: save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputFileError(
            path, f"is not UTF-8 text (byte {err.start} is {data[err.start]:#04x}): a binary file?"
        ) from None


# How long a pipe (a FIFO, `<(command)`) may keep an input waiting for its next bytes: a
# FIFO nobody writes to would otherwise block the command forever.
PIPE_WAIT_SECONDS = 10.0


def _read_pipe(path: Path, limit: int) -> bytes:
    """Up to `limit` bytes from a pipe, until its writer closes it; an InputFileError
    when no byte (nor the end) arrives within PIPE_WAIT_SECONDS."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening never waits for a writer
    try:
        data = bytearray()
        while len(data) < limit:
            ready, _, _ = select.select([handle], [], [], PIPE_WAIT_SECONDS)
            if not ready:
                raise InputFileError(
                    path,
                    f"is a pipe that delivered nothing for {PIPE_WAIT_SECONDS:g} s "
                    "(a FIFO with no writer?)",
                )
            try:
                chunk = os.read(handle, min(65_536, limit - len(data)))
            except BlockingIOError:  # woken, but the bytes went to another reader
                continue
            if not chunk:
                break
            data += chunk
        return bytes(data)
    finally:
        os.close(handle)


def parse_json(text: str, where: str) -> Any:
    """JSON as the standard library reads it, but refusing NaN and Infinity (not JSON)
    and nesting deeper than MAX_JSON_DEPTH. `where` names the text in errors (a file,
    or a file and a line)."""
    try:
        document = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        detail = f"is not JSON: {err.msg} (line {err.lineno} column {err.colno})"
        raise InputFileError(where, detail) from None
    except RecursionError:
        raise InputFileError(where, f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as err:  # an integer past the digit limit, or a refused constant
        raise InputFileError(where, f"is not usable JSON: {err}") from None
    if json_depth(document) > MAX_JSON_DEPTH:
        raise InputFileError(where, f"nests deeper than {MAX_JSON_DEPTH} levels")
    return document


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_depth(document: Any) -> int:
    """How deeply lists and objects nest in a parsed document (a scalar: 0), counted
    without recursion, stopping once past MAX_JSON_DEPTH."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, depth = pending.pop()
        if not isinstance(value, dict | list):
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        children = value.values() if isinstance(value, dict) else value
        pending.extend((child, depth + 1) for child in children)
    return deepest


# -------------------------------------------------------------------------- out


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace path's content all at once: a temporary file beside it, flushed to disk,
    then renamed over it. On any error the target is as it was and no temporary file
    is left; the error is raised (an OutputPathError where the path is no regular file)."""
    data = content.encode() if isinstance(content, str) else content
    target = output_target(path)
    mode = _new_file_mode(target)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            os.fchmod(stream.fileno(), mode)  # mkstemp's 0600 is for the temporary only
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def output_target(path: Path) -> Path:
    """The file a write to path replaces: path with its symbolic links followed (the
    link is kept, the file it names replaced). An OutputPathError if something other
    than a regular file stands there: replacing a device, a FIFO, a socket or a folder
    would destroy what the user pointed at by mistake."""
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as err:
        raise OutputPathError(path, f"cannot be examined: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise OutputPathError(path, f"is {_kind_of(mode)}, not a regular file; name a file")
    return target


def _kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _new_file_mode(target: Path) -> int:
    """The mode of the file it replaces, or what open() would create under the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process's umask. Read from /proc where Linux offers it, because setting it to
    read it back (the only portable way) briefly changes it for every thread."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Kernel pseudo-filesystems: a folder there is never a place for files. (/dev is not
# one: /dev/shm is a fine tmpfs; a device at a file path is output_target's refusal.)
PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"))


def prepare_output_dir(path: Path) -> None:
    """Create the folder (and its parents) and prove a file can be written in it. An
    OutputPathError names the problem: a pseudo-filesystem, a loop of symbolic links, a
    file where a folder should be, a read-only filesystem, no permission."""
    resolved = Path(os.path.realpath(path))
    if any(resolved.is_relative_to(root) for root in PSEUDO_FILESYSTEMS):
        root = next(r for r in PSEUDO_FILESYSTEMS if resolved.is_relative_to(r))
        raise OutputPathError(path, f"is under {root}, the kernel's, not a folder on disk")
    try:
        os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise OutputPathError(path, f"cannot write files here: {_why(err)}") from None
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=path, prefix=".schedspec-probe-")
        os.close(handle)
        os.unlink(probe)  # our own probe: the only file this function removes
    except OSError as err:
        raise OutputPathError(path, f"cannot write files here: {_why(err)}") from None


# Errors a folder meets, said plainly.
_REASONS = {
    errno.ELOOP: "a loop of symbolic links",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file stands there, not a folder",
    errno.EROFS: "the filesystem is read-only",
    errno.ENOSPC: "no space left on the device",
}


def _why(err: OSError) -> str:
    return _REASONS.get(err.errno or 0, err.strerror or str(err))


def require_free_space(folder: Path, needed: int) -> None:
    """OutputPathError unless the filesystem holding the folder has `needed` bytes free
    (for a command whose outputs come after its expensive part)."""
    try:
        info = os.statvfs(folder)
    except OSError as err:
        raise OutputPathError(folder, f"cannot be examined: {_why(err)}") from None
    free = info.f_bavail * info.f_frsize
    if free < needed:
        raise OutputPathError(
            folder, f"has {free:,} bytes free, less than the {needed:,} its files may take"
        )


def prepare_output_file(path: Path) -> None:
    """Check that the file can be written: nothing but a regular file stands there (see
    output_target) and its folder exists (created) and takes a new file. A report left
    by an earlier run stays until the run's own report replaces it, keeping its mode."""
    target = output_target(path)
    try:
        prepare_output_dir(target.parent)
    except OutputPathError as err:
        if target == Path(os.path.abspath(path)):
            raise
        raise OutputPathError(path, f"leads to {err}") from None  # name what the user gave
