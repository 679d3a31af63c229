"""How a command line process ends: with its own exit status (0 done, 1 failed, 2 bad input), never
by a signal. :func:`run_and_exit` runs the command, does what the interpreter's exit does for Python
code (non-daemon threads, atexit handlers, flushed output), then ends the process with
:func:`os._exit`, skipping the native libraries' finalization, where a pyarrow or delta-rs thread
can abort the process (SIGABRT). See docs/jobs.md (How a command line process ends).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from schemas.errors import RmqLakeError, ValidationError

# exit statuses of the command lines
EXIT_OK = 0
EXIT_FAILED = 1  # work that failed: another error of the product (one line) or an unexpected one (a traceback)
EXIT_BAD_INPUT = 2  # a usage error or a ValidationError, printed as one line
EXIT_FLUSH_FAILED = 120  # as CPython: stdout could not be flushed at exit (e.g. a closed pipe)
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a process killed by it


def status_of(exc: SystemExit) -> int:
    """The exit status ``sys.exit(code)`` gives: None is 0, an int is itself, anything else is
    printed to stderr and gives 1."""
    code = exc.code
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_FAILED


def run_command(command: Callable[[], int]) -> int:
    """``command()``'s exit status, an error of the product printed as one line on stderr:
    2 for bad input (:class:`~schemas.errors.ValidationError`), 1 for work that failed (any other
    :class:`~schemas.errors.RmqLakeError`: a broker locked elsewhere, a conflicting commit, a
    missing table)."""
    try:
        return command()
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RmqLakeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def run_main(main: Callable[[], int]) -> int:
    """``main()``'s exit status, as the interpreter would make it of an uncaught exception.

    ``SystemExit`` (argparse's usage errors and ``--help``) gives its code; ``KeyboardInterrupt``
    gives 130; any other exception prints its traceback through :data:`sys.excepthook` and gives 1.
    """
    try:
        return main()
    except SystemExit as exc:
        return status_of(exc)
    except KeyboardInterrupt as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return EXIT_FAILED


def run_and_exit(main: Callable[[], int], cleanup: Callable[[], None] | None = None) -> NoReturn:
    """Run ``main``, then ``cleanup`` (e.g. stop the Spark session), then end the process with
    ``main``'s exit status without finalizing the native libraries (see the module docstring).

    A failing ``cleanup`` prints its traceback and turns a status of 0 into 1.
    """
    status = run_main(main)
    if cleanup is not None:
        cleanup_status = run_main(_returning_zero(cleanup))
        if status == EXIT_OK:
            status = cleanup_status
    exit_now(status)


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` after the Python part of an interpreter exit: wait for the
    non-daemon threads, run the :mod:`atexit` handlers, flush stdout and stderr."""
    # threading._shutdown is what the interpreter's exit calls first: it runs the threading atexit
    # hooks (concurrent.futures stops its idle workers) and joins every non-daemon thread
    shutdown_threads: Callable[[], None] | None = getattr(threading, "_shutdown", None)
    if shutdown_threads is not None:
        shutdown_threads()
    atexit._run_exitfuncs()
    if not _flush(sys.stdout) and status == EXIT_OK:
        status = EXIT_FLUSH_FAILED
    _flush(sys.stderr)
    os._exit(status)


def _flush(stream: object) -> bool:
    flush = getattr(stream, "flush", None)
    if flush is None:
        return True
    try:
        flush()
    except (OSError, ValueError):  # a closed pipe or a closed stream: nothing more can be written
        return False
    return True


def _returning_zero(function: Callable[[], None]) -> Callable[[], int]:
    def call() -> int:
        function()
        return EXIT_OK

    return call
