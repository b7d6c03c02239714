"""``python -m control.console``: the console web application (settings from the environment)."""
from extproc.settings import Settings

from .app import run

run(Settings.from_env())
