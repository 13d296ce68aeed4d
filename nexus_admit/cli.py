"""`nexus-admit`: the command group. Each command lives in its own module under
`nexus_admit.commands` and registers itself here; add new commands (run, simulate, bench,
snapshot) the same way."""

from __future__ import annotations

from typing import Annotated

import typer

from nexus_admit import __version__
from nexus_admit.commands import bench, plan, release, run, simulate

__all__ = ["app", "main"]

app = typer.Typer(
    name="nexus-admit",
    help="Kueue AdmissionCheck controller that places GPU gangs with one CP-SAT solve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"nexus-admit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version, exit."
        ),
    ] = False,
) -> None:
    """Kueue AdmissionCheck controller that places GPU gangs with one CP-SAT solve."""


plan.register(app)
run.register(app)
bench.register(app)
simulate.register(app)
release.register(app)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
