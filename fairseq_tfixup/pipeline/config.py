"""Experiment configs: ``configs/NAME.sh``, bash-sourceable ``KEY=value`` lines.

The same file is sourced by the shell scripts and parsed here, so the format
stays deliberately small: one assignment per line, values plain or quoted
(no ``$`` expansion, no commands), ``#`` comments. As in the scripts, an
environment variable of the same name overrides the file.
"""

import os
import pathlib
import re
import shlex
from typing import Dict, Mapping, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
_ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")


def config_path(name: str) -> pathlib.Path:
    path = pathlib.Path(name)
    if path.suffix == ".sh" and path.is_file():
        return path
    return CONFIG_DIR / f"{name}.sh"


def experiment_names() -> list:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.sh"))


def parse_config(text: str) -> Dict[str, str]:
    """KEY=value lines -> dict of strings (quotes removed the way bash would)."""
    values = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _ASSIGNMENT.match(line)
        if not m:
            raise ValueError(f"line {n}: not a KEY=value assignment: {line!r}")
        if "$" in m.group(2) or "`" in m.group(2):
            raise ValueError(f"line {n}: configs hold plain values, no expansions: {line!r}")
        words = shlex.split(m.group(2), comments=True)
        values[m.group(1)] = " ".join(words)
    return values


def load_config(name: str, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The config of experiment ``name``, with environment overrides applied."""
    path = config_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"unknown experiment '{name}' (no {path})")
    values = parse_config(path.read_text(encoding="utf-8"))
    environ = os.environ if environ is None else environ
    for key in values:
        if key in environ:
            values[key] = environ[key]
    values["NAME"] = path.stem
    return values
