"""What ``pip install`` of the project promises (pyproject.toml): dependency ranges that hold the versions the lock
tests, the Airflow entry points, and provider metadata whose ``package-name`` is the distribution's name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.lock").read_text(), re.M)
    return {canonicalize_name(name): version for name, version in pins}


def test_every_runtime_dependency_admits_the_locked_version():
    locked = _locked()
    requirements = [Requirement(r) for r in PROJECT["dependencies"]]
    assert requirements, "pyproject.toml declares no runtime dependencies: pip install would give a broken Shoal"
    outside = {r.name: (str(r.specifier), locked.get(canonicalize_name(r.name)))
               for r in requirements if locked.get(canonicalize_name(r.name)) not in r.specifier}
    assert not outside, f"ranges that exclude (or name a package missing from) requirements.lock: {outside}"


def test_every_direct_requirement_is_declared_or_named_as_not_runtime():
    direct = {canonicalize_name(m) for m in re.findall(r"^([A-Za-z0-9_.-]+)==", (ROOT / "requirements.txt").read_text(),
                                                         re.M)}
    declared = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    optional = {canonicalize_name(Requirement(r).name) for extra in PROJECT["optional-dependencies"].values()
                for r in extra}
    not_runtime = {"psycopg2-binary",  # the compose stack's Postgres driver (the Airflow image brings its own)
                   "pandas"}  # pinned only to keep PySpark's pandas warning away; Shoal does not import it
    assert direct - declared - optional - not_runtime == set()


def test_requires_python_matches_what_the_lock_needs():
    spec = SpecifierSet(PROJECT["requires-python"])
    assert "3.10" not in spec, "the lock needs Python >= 3.11 (pyspark 4.3, numpy, the Airflow providers)"
    assert all(version in spec for version in ("3.11", "3.12", "3.13"))


def test_entry_points_name_the_page_plugin_and_the_provider_info():
    eps = PROJECT["entry-points"]
    assert eps["airflow.plugins"] == {"shoal_ui": "shoal_airflow.shoal_ui:ShoalUIPlugin"}
    assert eps["apache_airflow_provider"] == {"provider_info": "shoal_airflow.provider_info:get_provider_info"}


def test_provider_info_is_the_distribution_and_registers_no_connection_type_or_plugin():
    from shoal_airflow.provider_info import get_provider_info

    info = get_provider_info()
    assert info["package-name"] == PROJECT["name"]
    assert "connection-types" not in info and "hook-class-names" not in info  # the kafka provider owns `kafka`
    assert "plugins" not in info  # the airflow.plugins entry point registers the page; twice would warn
    modules = {m for kind in ("hooks", "operators", "sensors", "triggers") for entry in info[kind]
               for m in entry["python-modules"]}
    assert modules == {f"shoal_airflow.{m}" for m in ("hooks", "operators", "sensors", "triggers")}
    assert all((ROOT / (m.replace(".", "/") + ".py")).exists() for m in modules)
