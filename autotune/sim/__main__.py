"""``python -m autotune.sim serve|predict|scenarios ...``.

``serve`` goes straight to the server's argparse (exactly SGLang's flag handling, exit 2 on a bad
flag); the other commands go through the Typer app of :mod:`autotune.sim.cli`.
"""

from __future__ import annotations

import sys


def _main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        from autotune.sim.server import main

        sys.exit(main(sys.argv[2:]))
    import typer

    from autotune.sim.cli import app

    try:
        rc = app(standalone_mode=False, prog_name="python -m autotune.sim")
    except typer.TyperException as exc:  # what typer's parser raises (typer >= 0.26 vendors click)
        exc.show()  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    _main()
