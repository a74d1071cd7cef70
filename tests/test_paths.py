"""dcut_sched.paths: shipped inputs through importlib.resources; local artifacts by environment
variable, then user cache, then checkout (docs/design.md, "Package data and local artifacts")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dcut_sched import paths
from dcut_sched.simulator import defaults

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_defaults_exist():
    for name in defaults.DEFAULT_TRACES:
        assert defaults.default_trace_path(name).is_file(), name
        assert defaults.default_trace_path(name).with_suffix(".md").is_file(), name  # its card
    assert defaults.default_cost_path().is_file()
    assert paths.prompts_path().is_file()
    assert all(paths.prompts_path(name).is_file() for name in paths.PROMPT_SETS)
    assert paths.profile_path("cpu-smollm2-135m-b8.json").is_file()


def test_checkout_root_is_this_tree():
    assert paths.checkout_root() == ROOT


def test_package_data_rule_matches_the_tracked_files():
    """Every tracked data file under the package is one pyproject's package-data rule ships."""
    tracked = subprocess.run(["git", "ls-files", "dcut_sched/data", "dcut_sched/profiler/profiles"], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    data = [Path(f) for f in tracked.stdout.split() if not f.endswith(".py")]
    assert data
    shipped_suffixes = {"dcut_sched/data/traces": {".parquet", ".md", ".jsonl"},
                        "dcut_sched/profiler/profiles": {".json"}}
    for f in data:
        assert f.suffix in shipped_suffixes[str(f.parent)], f


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    for var, *_ in paths.LOCAL_ARTIFACTS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_local_artifact_environment_variable_wins(no_env, monkeypatch):
    monkeypatch.setenv("DCUT_VLLM_VENV", str(no_env / "somewhere"))
    assert paths.local_artifact("vllm-venv") == no_env / "somewhere"  # even before it exists


def test_local_artifact_user_cache_before_checkout(no_env, monkeypatch):
    checkout = no_env / "checkout"
    (checkout / "drafters").mkdir(parents=True)
    monkeypatch.setattr(paths, "checkout_root", lambda: checkout)
    assert paths.user_cache_dir() == no_env / "xdg" / "dcut-sched"
    assert paths.local_artifact("drafters") == checkout / "drafters"  # the only one that exists
    (no_env / "xdg" / "dcut-sched" / "drafters").mkdir(parents=True)
    assert paths.local_artifact("drafters") == no_env / "xdg" / "dcut-sched" / "drafters"
    assert paths.drafter_dir("x") == no_env / "xdg" / "dcut-sched" / "drafters" / "x"


def test_local_artifact_none_exists(no_env, monkeypatch):
    checkout = no_env / "checkout"
    monkeypatch.setattr(paths, "checkout_root", lambda: checkout)
    assert paths.local_artifact("vllm-models") == checkout / ".cache" / "vllm-models"  # made in the checkout
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    assert paths.local_artifact("vllm-models") == no_env / "xdg" / "dcut-sched" / "vllm-models"


def test_no_module_resolves_paths_from_its_own_location():
    """Only dcut_sched/paths.py says where files are (docs/design.md)."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "dcut_sched").rglob("*.py")
                 if "parents[" in p.read_text() or "Path(__file__)" in p.read_text()]
    assert offenders == []


def test_a_bare_drafter_name_is_found_under_dcut_drafters(no_env, monkeypatch):
    from dcut_sched.drafters import parse_draft_spec

    shelf = no_env / "shelf"
    (shelf / "my-drafter").mkdir(parents=True)
    (shelf / "my-drafter" / "config.json").write_text("{}\n")
    monkeypatch.setenv("DCUT_DRAFTERS", str(shelf))
    monkeypatch.chdir(no_env)
    assert parse_draft_spec("dflash:my-drafter").path == shelf / "my-drafter"
    with pytest.raises(ValueError, match="no DFlash drafter folder there"):
        parse_draft_spec("dflash:other-drafter")

