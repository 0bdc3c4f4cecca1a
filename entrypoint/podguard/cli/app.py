"""The root of the `podguard` command and its error handling.

`main()` runs Typer in non-standalone mode so that every usage error (bad option value, unknown
option, bad environment variable) becomes one line on stderr and exit 64, never a traceback or
Click's exit 2, as PRODUCT.md's exit-code table requires.
"""

from __future__ import annotations

import sys

import typer
from typer import exceptions as typer_exc
from typer._click import exceptions as click_exc

from podguard import __version__
from podguard.errors import ExitCode, PodguardError

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


NODE_COMMANDS = ("gpus", "health", "cleanup", "doctor")
LAUNCH_COMMANDS = ("train", "run", "sweep")
# Command groups in modules of their own, imported only when invoked (the pod commands load an HTTP
# client, the image commands the Docker SDK): group name -> module with `register(app, only=name)`.
GROUP_MODULES: dict[str, str] = {}


def _register(argv: list[str]) -> None:
    """Register the commands this invocation can reach.

    Typer builds a Click command for every registered function on every start (~4 ms each, plus its
    module's imports); `podguard run` is on a training job's start-up path, so only the invoked command is
    built. `--help`, no command, or an unknown one registers them all (help lists them; errors name them).
    """
    import importlib

    from podguard.cli import launch, node

    first = next((a for a in argv if not a.startswith("-")), None)
    if first in NODE_COMMANDS or first in LAUNCH_COMMANDS:
        (node if first in NODE_COMMANDS else launch).register(app, only=first)
        return
    if first in GROUP_MODULES:
        importlib.import_module(GROUP_MODULES[first]).register(app, only=first)
        return
    node.register(app)
    launch.register(app)
    for name, module in GROUP_MODULES.items():
        importlib.import_module(module).register(app, only=name)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn every failure into a documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _register(args)
    try:
        code = app(args=args, prog_name="podguard", standalone_mode=False)
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        code = ExitCode.USAGE
    except click_exc.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        print(f"podguard: error: {exc.format_message()}{hint}", file=sys.stderr)
        code = ExitCode.USAGE
    except click_exc.ClickException as exc:
        print(f"podguard: error: {exc.format_message()}", file=sys.stderr)
        code = ExitCode.USAGE
    except typer_exc.Abort:
        code = 130
    except PodguardError as exc:
        print(f"podguard: error: {exc.message}", file=sys.stderr)
        code = exc.code
    except BrokenPipeError:
        code = 0
    sys.exit(int(code or 0))
