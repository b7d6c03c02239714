"""``python -m control.console``: the console web application (settings from the environment)."""
from .settings import ConsoleSettings

from .app import run

run(ConsoleSettings.from_env())
