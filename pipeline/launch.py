"""The `lfbench` command's entry point: a stage (`lfbench run|stage`, what every dvc.yaml stage
runs) first asks the warm stage server to run `pipeline.cli` for this process
(`pipeline.stages.warm_stage`); everything else, and a stage the server cannot take, runs
`pipeline.cli` here. Imports nothing more before that choice."""

from __future__ import annotations

import sys

ENTRY = "pipeline.cli:main"  # what the warm stage server's child runs for this process


def main() -> None:
    if sys.argv[1:2] in (["run"], ["stage"]):
        from pipeline.stages import warm_stage

        if warm_stage.wanted(sys.argv):
            code = warm_stage.run_in_server(sys.argv, ENTRY)
            if code is not None:
                sys.exit(code)
    from pipeline.cli import main as cli_main

    cli_main()


if __name__ == "__main__":  # pragma: no cover
    main()
