"""The root of the `podguard` command and its error handling.

`main()` runs Typer in non-standalone mode so that every usage error (bad option value, unknown
option, bad environment variable) becomes one line on stderr and exit 64, never a traceback or
Click's exit 2, as docs/reference.md's exit-code table says. A reader that goes away early (`podguard doctor
--json | head`) ends the command quietly: the node commands finish with their own exit code (cli/node.py),
others that were cut off mid-output exit 141 (128 + SIGPIPE, what a shell tool reports); never Python's
BrokenPipeError message and exit 120 at shutdown.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import typer
from typer import exceptions as typer_exc
from typer._click import exceptions as click_exc

from podguard import __version__, console
from podguard.errors import ExitCode, PodguardError
from podguard.job.ending import refused_in_pod

app = typer.Typer(
    name="podguard",
    help="Make GPU training start reliably: clean up GPU holders, select and health-gate GPUs, launch and "
    "supervise the job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"podguard {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """podguard: reliable GPU job start-up on RunPod and any Docker GPU host."""


# Each command lives in a module imported only when it is invoked (Typer builds a Click command for every
# registered function, ~4 ms each plus its module's imports; the pod commands load an HTTP client, the image
# commands the Docker SDK): command name -> module with `register(app, only=name)`.
COMMAND_MODULES: dict[str, str] = {
    "gpus": "podguard.cli.node",
    "health": "podguard.cli.node",
    "cleanup": "podguard.cli.node",
    "doctor": "podguard.cli.node",
    "train": "podguard.cli.launch",
    "run": "podguard.cli.launch",
    "sweep": "podguard.cli.sweep",
    "pod": "podguard.cli.pods",
    "template": "podguard.cli.pods",
    "image": "podguard.cli.image",
    "checkpoints": "podguard.cli.checkpoints",
}


def _register(argv: list[str]) -> None:
    """Register the commands this invocation can reach: only the invoked one (`podguard run` is on a
    training job's start-up path); `--help`, no command, or an unknown one registers them all (help lists
    them; errors name them)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    names = [first] if first in COMMAND_MODULES else list(COMMAND_MODULES)
    for name in names:
        importlib.import_module(COMMAND_MODULES[name]).register(app, only=name)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn every failure into a documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    console.debug_logging()
    _register(args)
    try:
        code = app(args=args, prog_name="podguard", standalone_mode=False)
    except SystemExit:
        if not _stdout_pacified():
            raise
        code = _reader_gone()  # Click met EPIPE mid-output (unbuffered stdout) and chose exit 1: ours is 141
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        code = ExitCode.USAGE
    except click_exc.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        _refused_in_pod(args, ExitCode.USAGE, exc.format_message())
        console.error(f"{exc.format_message()}{hint}")
        code = ExitCode.USAGE
    except click_exc.ClickException as exc:
        _refused_in_pod(args, ExitCode.USAGE, exc.format_message())
        console.error(exc.format_message())
        code = ExitCode.USAGE
    except typer_exc.Abort:
        code = 130
    except PodguardError as exc:  # (train/run: an option's value refused before the conductor ran)
        _refused_in_pod(args, exc.code, exc.message)
        console.error(exc.message)
        code = exc.code
    except BrokenPipeError:
        code = _reader_gone()
    sys.exit(_flush_stdout(int(code or 0)))


def _refused_in_pod(args: list[str], code: int, message: str) -> None:
    """`train`/`run` refused before the conductor ran (a bad option): inside a pod it still says END preflight, a
    keeper reading the pod's log stops the pod instead of waiting on a container that restarts into the same
    refusal. The conductor says every other END and handles its own errors (job/ending.py)."""
    if args and args[0] in ("train", "run"):
        refused_in_pod(args[0], code, message)


READER_GONE = 128 + signal.SIGPIPE  # 141: the output's reader went away before the command finished writing


def _stdout_pacified() -> bool:
    """Whether Click replaced stdout after an EPIPE (it does so only on that path, then exits 1)."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _reader_gone() -> int:
    discard_stdout()
    return READER_GONE


def _flush_stdout(code: int) -> int:
    """Write what is buffered now, while an EPIPE can still be handled: at shutdown Python would print
    'Exception ignored ... BrokenPipeError' and exit 120. The command finished, so its code stands."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stdout()
    except (OSError, ValueError):
        pass
    return code


def discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
