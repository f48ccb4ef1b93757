"""gpu_notebook._settings: every GPU_NOTEBOOK_* variable, its default, a set value and a bad one, parsed as the
code that reads it always parsed it; the table in docs/settings.md lists the same variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_notebook import _settings

ROOT = Path(__file__).resolve().parents[1]
ALL_VARS = sorted(v for k, v in vars(_settings).items() if k.endswith("_VAR"))


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)


def test_the_line_settings_default_parse_and_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.output_lines() == 2000 and _settings.log_lines() == 5000
    monkeypatch.setenv(_settings.OUTPUT_LINES_VAR, " 10_000 ")
    monkeypatch.setenv(_settings.LOG_LINES_VAR, "2")
    assert _settings.output_lines() == 10_000 and _settings.log_lines() == 2
    monkeypatch.setenv(_settings.OUTPUT_LINES_VAR, "  ")  # blank is unset
    assert _settings.output_lines() == 2000
    for bad in ("1", "0", "-5", "many", "2.5"):
        monkeypatch.setenv(_settings.LOG_LINES_VAR, bad)
        with pytest.raises(
            ValueError, match="GPU_NOTEBOOK_LOG_LINES must be a whole number of lines, at least 2"
        ):
            _settings.log_lines()


def test_the_seconds_settings_default_parse_and_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.interrupt_grace() == 5.0 and _settings.stall_report_s() == 120.0
    monkeypatch.setenv(_settings.INTERRUPT_GRACE_VAR, "30")
    monkeypatch.setenv(_settings.STALL_REPORT_VAR, "0")  # 0 turns the report off; a grace must be above 0
    assert _settings.interrupt_grace() == 30.0 and _settings.stall_report_s() == 0.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(_settings.INTERRUPT_GRACE_VAR, bad)
        with pytest.raises(
            ValueError, match="GPU_NOTEBOOK_INTERRUPT_GRACE must be a number of seconds above 0"
        ):
            _settings.interrupt_grace()
    for bad in ("-1", "nan", "inf", "later"):
        monkeypatch.setenv(_settings.STALL_REPORT_VAR, bad)
        with pytest.raises(ValueError, match="GPU_NOTEBOOK_STALL_REPORT must be a number of seconds, 0 to"):
            _settings.stall_report_s()


def test_interruptible_waits_are_on_unless_exactly_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.interruptible_waits()
    for value, on in (("0", False), (" 0 ", False), ("1", True), ("off", True), ("", True)):
        monkeypatch.setenv(_settings.INTERRUPTIBLE_WAITS_VAR, value)
        assert _settings.interruptible_waits() is on, value


def test_the_native_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.native_switched_off() is None
    for value in ("0", "false", "No", " off ", ""):  # false words (any case) and blank leave the kernels on
        monkeypatch.setenv(_settings.NO_C_EXT_VAR, value)
        assert _settings.native_switched_off() is None, value
    monkeypatch.setenv(_settings.NO_C_EXT_VAR, "1")
    assert _settings.native_switched_off() == "GPU_NOTEBOOK_NO_C_EXT=1"
    monkeypatch.setenv(_settings.NO_C_EXT_VAR, "yes please")
    assert _settings.native_switched_off() == "GPU_NOTEBOOK_NO_C_EXT=yes please"  # shown as it was set
    monkeypatch.delenv(_settings.NO_C_EXT_VAR)
    for value, off in (("1", False), ("on", False), ("", False), ("0", True), ("FALSE", True), (" no", True)):
        monkeypatch.setenv(_settings.NATIVE_VAR, value)
        assert (_settings.native_switched_off() == f"GPU_NOTEBOOK_NATIVE={value}") is off, value


def test_the_preemption_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.cloud() == "" and _settings.metadata_url() is None and _settings.vm_name() is None
    monkeypatch.setenv(_settings.CLOUD_VAR, "  AWS ")
    monkeypatch.setenv(_settings.METADATA_URL_VAR, "http://127.0.0.1:1234")
    monkeypatch.setenv(_settings.VM_NAME_VAR, "vm-7")
    assert _settings.cloud() == "aws"
    assert _settings.metadata_url() == "http://127.0.0.1:1234" and _settings.vm_name() == "vm-7"
    monkeypatch.setenv(_settings.CLOUD_VAR, "oracle")  # not one of ours: the watcher then watches nothing
    assert _settings.cloud() == "oracle"
    monkeypatch.setenv(_settings.METADATA_URL_VAR, "")
    monkeypatch.setenv(_settings.VM_NAME_VAR, "")
    assert _settings.metadata_url() is None and _settings.vm_name() is None  # empty is unset


def test_the_folder_and_key_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        _settings.cache_dir() is None and _settings.config_dir() is None and _settings.gcp_api_key() is None
    )
    monkeypatch.setenv(_settings.CACHE_DIR_VAR, "/tmp/c")
    monkeypatch.setenv(_settings.CONFIG_DIR_VAR, "~/cfg")  # expanded by the caller, as before
    monkeypatch.setenv(_settings.GCP_API_KEY_VAR, "k")
    assert (_settings.cache_dir(), _settings.config_dir(), _settings.gcp_api_key()) == (
        "/tmp/c",
        "~/cfg",
        "k",
    )
    for name in (_settings.CACHE_DIR_VAR, _settings.CONFIG_DIR_VAR, _settings.GCP_API_KEY_VAR):
        monkeypatch.setenv(name, "")
    assert (
        _settings.cache_dir() is None and _settings.config_dir() is None and _settings.gcp_api_key() is None
    )


def test_the_callers_fall_back_as_before(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpu_notebook.catalog._types import cache_path
    from gpu_notebook.cloud._state import config_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    assert cache_path() == tmp_path / "xdg-cache" / "gpu_notebook" / "gpu_catalog.json"
    assert config_dir() == tmp_path / "xdg-config" / "gpu_notebook"
    monkeypatch.setenv(_settings.CACHE_DIR_VAR, str(tmp_path / "mine"))
    monkeypatch.setenv(_settings.CONFIG_DIR_VAR, str(tmp_path / "cfg"))
    assert cache_path() == tmp_path / "mine" / "gpu_catalog.json" and config_dir() == tmp_path / "cfg"


def test_skip_ray_version_check_is_exactly_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _settings.skip_ray_version_check()
    for value, skip in (("1", True), ("true", False), (" 1", False), ("0", False)):
        monkeypatch.setenv(_settings.SKIP_RAY_VERSION_CHECK_VAR, value)
        assert _settings.skip_ray_version_check() is skip, value


def test_the_proxy_prefix_is_read_from_the_given_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.proxy_prefix() == "" and _settings.proxy_prefix({}) == ""
    monkeypatch.setenv(_settings.PROXY_PREFIX_VAR, " /user/me/ ")
    assert _settings.proxy_prefix() == "/user/me/"
    assert (
        _settings.proxy_prefix({_settings.PROXY_PREFIX_VAR: "off"}) == "off"
    )  # the given one, not os.environ


def test_every_variable_is_listed_once_and_documented_in_the_table() -> None:
    listed = [v.name for v in _settings.VARIABLES]
    assert sorted(listed) == ALL_VARS and len(set(listed)) == len(listed)
    assert all(v.default and v.what and v.read for v in _settings.VARIABLES)
    table = (ROOT / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `(GPU_NOTEBOOK_\w+)`.*$", table, flags=re.M)
    lines = [line for line in table.splitlines() if line.startswith("| `GPU_NOTEBOOK_")]
    # the library's rows are VARIABLES, in order and word for word ...
    expected = [f"| `{v.name}` | {v.default} | {v.what} | {v.read} |" for v in _settings.VARIABLES]
    assert lines[: len(expected)] == expected, "docs/settings.md: the library's rows are _settings.VARIABLES"
    # ... then the variables of the build, the examples and the development scripts, which the library never reads
    outside = {
        "GPU_NOTEBOOK_BUILD_NATIVE",
        "GPU_NOTEBOOK_EXAMPLE_SIZE",
        "GPU_NOTEBOOK_TEST_WORKERS",
        "GPU_NOTEBOOK_NO_UV",
    }
    assert set(rows) == set(listed) | outside and len(rows) == len(listed) + len(outside)


def test_no_module_but_the_settings_reads_a_variable_of_ours() -> None:
    read = re.compile(r"(environ|getenv)[^\n]*GPU_NOTEBOOK_|GPU_NOTEBOOK_\w+[\"']\s*(in|,)[^\n]*environ")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "gpu_notebook").rglob("*.py"))
        if p.name != "_settings.py" or p.parent.name != "gpu_notebook"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert not offenders, offenders
