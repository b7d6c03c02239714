"""What every deployment shape does to a running Envoy, in one place: apply a changed catalog (re-render its
clusters, which Envoy swaps in without a restart) and drain it (``core.envoy_admin.drain``: refuse new
connections, let the requests and streams in flight finish).  ``gateway up`` (control.launcher) and the image's Envoy
(control.envoy_runner, compose and Kubernetes) both use these."""
from __future__ import annotations

from pathlib import Path

from core import catalog as catalog_mod
from core.envoy_admin import drain

from . import envoy_config
from .settings import Settings

__all__ = ["CatalogWatch", "drain"]


class CatalogWatch:
    """Notices a changed catalog file and renders its clusters for Envoy; a catalog that does not load
    changes nothing (the clusters in force stay)."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.path = Path(s.catalog)
        self.seen = 0
        self.seen = self._mtime()

    def _mtime(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:  # being replaced: as it was
            return self.seen

    def apply(self) -> None:
        envoy_config.write_cds(catalog_mod.load(self.path), self.s)

    def poll(self) -> str | None:
        """One look: None when unchanged, else one line saying what became of the change."""
        mtime = self._mtime()
        if mtime == self.seen:
            return None
        self.seen = mtime
        try:
            self.apply()
        except (OSError, catalog_mod.CatalogError) as e:
            return f"catalog not applied, the one in force stays: {e}"
        return "catalog change applied"
