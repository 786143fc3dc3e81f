"""The module paths of Shoal's Airflow code before it became the package ``shoal_airflow``, kept importable.

Until issue 15 the code lived in a top-level package named ``plugins``. An Airflow database can still hold those
paths: a deferred ``ShoalCaughtUpSensor`` stores its trigger as ``plugins.triggers.ShoalLagTrigger``, which the
triggerer imports by name when it resumes. So ``plugins.<module>`` must keep resolving to ``shoal_airflow.<module>``
for every module listed in :data:`LEGACY_MODULES`.

Why not a ``plugins`` shim package: a top-level package called ``plugins`` is exactly what collides with the
plugins folder every Airflow image and Astro project keeps on ``sys.path`` (whichever comes first on the path
shadows the other). Instead :func:`install` appends one finder to the *end* of ``sys.meta_path``; Python asks it only
after every ordinary finder has failed, so a real ``plugins`` package or module anywhere on ``sys.path`` always wins
and is never shadowed. It answers for ``plugins`` itself (an empty package, only when none exists) and for the
listed submodules, which are aliases of the ``shoal_airflow`` modules (the same module objects, so the classes are
identical). ``import shoal_airflow`` installs it. Airflow imports ``shoal_airflow`` in each of its processes at start
through the ``airflow.plugins`` entry point: every ``Job`` (scheduler, triggerer) loads the plugins when it is
created (its listener manager), and the triggerer forks its trigger runner afterwards, so the runner inherits the
finder before it imports a stored classpath.

Where the old ``plugins`` name keeps resolving: an ordinary import of ``plugins.triggers`` from a Python that has
imported ``shoal_airflow``. Where it does not: a process that never imports ``shoal_airflow`` (not an Airflow
component), or one with a real ``plugins`` package that itself has a ``triggers`` module (that one wins).

Remove this module once no deployment can still hold a deferred task stored before the rename.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

LEGACY_PACKAGE = "plugins"
LEGACY_MODULES = {f"{LEGACY_PACKAGE}.{name}": f"shoal_airflow.{name}" for name in (
    "errors", "hooks", "operators", "params", "sensors", "shoal_ui", "triggers")}
# these two needed no Airflow and moved into mirror_core (issue #17)
LEGACY_MODULES |= {f"{LEGACY_PACKAGE}.lag": "mirror_core.services.lag",
                   f"{LEGACY_PACKAGE}.rehearsal": "mirror_core.services.rehearsal"}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the already-imported new module (``sys.modules`` then holds one object under both)."""

    def __init__(self, target: str | None):
        self.target = target

    def create_module(self, spec):
        if self.target is None:  # the empty legacy package
            module = types.ModuleType(spec.name, "Old name of shoal_airflow (see shoal_airflow.legacy_paths)")
            module.__path__ = []
            return module
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run (the target executed when it was imported under its own name); the import system has just
        set the alias's spec on the shared module object, so give it its own back."""
        if self.target is not None:
            module.__spec__ = self._own_spec


class LegacyPathFinder(importlib.abc.MetaPathFinder):
    """Resolves the old names, and only those, after every other finder declined."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == LEGACY_PACKAGE:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(None), is_package=True)
        if fullname in LEGACY_MODULES:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(LEGACY_MODULES[fullname]))
        return None


def install() -> None:
    """Append the finder to ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(finder, LegacyPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(LegacyPathFinder())
