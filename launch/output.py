"""Output tagging: every line an instance prints, prefixed ``[1,i]<stdout>:`` or
``[1,i]<stderr>:`` (mpirun ``--tag-output``, as Graphcore's poprun prints it).

Hydra (MPICH's mpirun) tags per chunk, not per line, and tags stderr as stdout, so poprun
has each instance's streams written to files and tags complete lines itself.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, TextIO


class LineTagger:
    """Turns a byte stream into tagged lines; a partial line waits for its end.

    A carriage return also ends a line, so a progress bar's refreshes become lines of their
    own; blank pieces between carriage returns (a bar clearing itself) are dropped, while
    genuinely empty lines are kept.

    Args:
        prefix: e.g. ``"[1,0]<stdout>:"``.
        write: called with each tagged line (ending in a newline).
    """

    def __init__(self, prefix: str, write: Callable[[str], None]):
        self.prefix = prefix
        self._write = write
        self._pending = b""

    def feed(self, data: bytes) -> None:
        data = (self._pending + data).replace(b"\r\n", b"\n")
        *lines, self._pending = data.split(b"\n")
        for line in lines:
            if b"\r" in line:
                self._refreshes(line.split(b"\r"))
            else:
                self._emit(line)
        # Refreshes still on the current line; a final "\r" waits: it may start "\r\n".
        cut = self._pending.rfind(b"\r", 0, len(self._pending) - 1)
        if cut >= 0:
            self._refreshes(self._pending[:cut].split(b"\r"))
            self._pending = self._pending[cut + 1:]

    def close(self) -> None:
        """Emit what is left of the last line (it has no newline)."""
        pending, self._pending = self._pending, b""
        if b"\r" in pending:
            self._refreshes(pending.split(b"\r"))
        elif pending:
            self._emit(pending)

    def _refreshes(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            if piece.strip():
                self._emit(piece)

    def _emit(self, line: bytes) -> None:
        self._write(f"{self.prefix}{line.decode(errors='replace')}\n")


class FileTailer:
    """Follows files that other processes append to, feeding new bytes to a tagger each.

    Args:
        sources: (path, tagger) pairs; a path that does not exist yet is waited for.
        interval_s: seconds between polls.
    """

    def __init__(self, sources: list[tuple[str, LineTagger]], interval_s: float = 0.05):
        self._sources = sources
        self._offsets = [0] * len(sources)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="poprun-output", daemon=True)

    def start(self) -> "FileTailer":
        self._thread.start()
        return self

    def poll(self) -> None:
        for k, (path, tagger) in enumerate(self._sources):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[k])
                    data = f.read()
            except FileNotFoundError:
                continue
            if data:
                self._offsets[k] += len(data)
                tagger.feed(data)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.poll()

    def stop(self) -> None:
        """Stop following, read what is left, and close every tagger."""
        self._stop.set()
        self._thread.join()
        self.poll()
        for _, tagger in self._sources:
            tagger.close()


def stream_writer(stream: TextIO) -> Callable[[str], None]:
    """A write function that flushes each line (instances' lines appear promptly)."""
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            stream.write(text)
            stream.flush()
    return write


def instance_output_paths(directory: str, index: int) -> tuple[str, str]:
    """Where instance ``index``'s stdout and stderr are written."""
    return (os.path.join(directory, f"out.{index}"), os.path.join(directory, f"err.{index}"))
