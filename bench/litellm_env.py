"""LiteLLM's proxy in an environment of its own (bench/.venv-litellm), shared by the benchmark (a peer
to compare with) and the suite (a real third-party model server, tests/test_litellm_upstream_e2e.py).

It lives apart from .venv because litellm pins an openai SDK the project's tests do not share.
``python -m bench.litellm_env`` installs it (``make litellm-env``); a second run only checks a stamp.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venv-litellm"
# Pinned: the suite asserts on what this version sends (its usage shapes); raise it on purpose.
SPEC = "litellm[proxy]==1.106.2"
LOG = VENV / "install.log"  # inside the (gitignored) environment


def installed() -> str | None:
    """The litellm binary when SPEC is installed (the stamp names it), else None."""
    binary, stamp = VENV / "bin" / "litellm", VENV / ".installed"
    try:
        return str(binary) if binary.exists() and stamp.read_text().strip() == SPEC else None
    except OSError:
        return None


def ensure(log: Path = LOG, timeout: float = 900) -> str | None:
    """The litellm binary, installing SPEC into VENV first if needed; None if that fails (the reason
    is at the end of the log)."""
    binary = installed()
    if binary is not None:
        return binary
    print(f"installing {SPEC} into {VENV.relative_to(ROOT)} (once) ...", file=sys.stderr, flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            if not (VENV / "bin" / "python").exists():
                subprocess.run([getattr(sys, "_base_executable", "python3"), "-m", "venv", str(VENV)],
                               check=True, stdout=out, stderr=subprocess.STDOUT)
            subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", SPEC],
                           check=True, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=timeout)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
            return None
    if not (VENV / "bin" / "litellm").exists():
        return None
    (VENV / ".installed").write_text(SPEC + "\n")
    return str(VENV / "bin" / "litellm")


def proxy_env(master_key: str) -> dict[str, str]:
    """The proxy's environment: offline (no tokenizer or cost-map download, which would hang here), no
    telemetry, no database or Redis (its lightest mode), ``master_key`` as the only key it accepts."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True",
               LITELLM_MASTER_KEY=master_key, LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False")
    for k in ("DATABASE_URL", "REDIS_URL"):
        env.pop(k, None)
    return env


def proxy_argv(binary: str, config: Path, port: int, workers: int = 1, host: str = "127.0.0.1") -> list[str]:
    return [binary, "--config", str(config), "--host", host, "--port", str(port),
            "--num_workers", str(workers)]


def main() -> int:
    if ensure() is None:
        print(f"{SPEC} could not be installed (see {LOG}): the LiteLLM tests will be skipped "
              "(and fail under CI=true)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
