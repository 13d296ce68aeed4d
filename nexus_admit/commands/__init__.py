"""CLI commands. Each module exposes `register(app: typer.Typer) -> None`; `nexus_admit.cli`
only wires them together."""
