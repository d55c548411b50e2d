"""Progress lines of ``maskrl plan`` on stderr: one line when a phase starts and one with its seconds
when it ends, so that a plan that takes minutes (docs/scaling.md, "How long a plan takes") says what
it is doing."""
from __future__ import annotations

import contextlib
import sys
import time
from typing import IO, Iterator


class Progress:
    """Writes ``maskrl plan: <phase> ...`` and ``maskrl plan: <phase>: <s> s`` lines to ``stream``.

    Args:
        stream: where the lines go (default ``sys.stderr``, read when a line is written).
        enabled: ``False`` writes nothing (the library's default: :func:`~maskrl.plan.make_plan` is
            quiet unless given a ``Progress``).
        prefix: the start of every line.
    """

    def __init__(self, stream: IO[str] | None = None, enabled: bool = True, prefix: str = "maskrl plan") -> None:
        self.stream = stream
        self.enabled = enabled
        self.prefix = prefix

    def note(self, text: str) -> None:
        """One line ``<prefix>: <text>``."""
        if self.enabled:
            print(f"{self.prefix}: {text}", file=self.stream or sys.stderr, flush=True)

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """A start line, the block, then an end line with the block's wall-clock seconds."""
        self.note(f"{what} ...")
        t0 = time.monotonic()
        yield
        self.note(f"{what}: {time.monotonic() - t0:.1f} s")

    def within(self, what: str) -> "Progress":
        """The same stream with ``what`` added to the prefix (the plans of ``what to change``)."""
        return Progress(self.stream, self.enabled, f"{self.prefix} [{what}]")


QUIET = Progress(enabled=False)
