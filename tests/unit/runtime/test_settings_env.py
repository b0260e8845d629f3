"""A variable with a service's prefix that names no setting stops the start with the
closest setting's name, at the top level as inside a group (issue #33)."""

from __future__ import annotations

import pytest

from apply.__main__ import main as apply_main
from apply.settings import ApplySettings
from capture.__main__ import main as capture_main
from capture.settings import CaptureSettings
from pipeline.__main__ import main as pipeline_main
from runtime.errors import ConfigError
from runtime.settings_env import (
    check_environment,
    retired_variables,
    setting_names,
    unknown_variables,
)


@pytest.mark.parametrize(
    ("main", "argv", "variable", "closest"),
    [
        (apply_main, ["errored"], "APPLY_LAKE_DELETION_VECTORS", "APPLY_LAKE__DELETION_VECTORS"),
        (capture_main, ["status"], "CAPTURE_STREAMNG", "CAPTURE_STREAMING"),
        (capture_main, ["status"], "CAPTURE_POSTGRES__SLOTT", "CAPTURE_POSTGRES__SLOT"),
        (pipeline_main, ["status"], "APPLY_TRIGER__MODE", "APPLY_TRIGGER__MODE"),
    ],
)
def test_a_misspelt_variable_stops_the_start_naming_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    main: object,
    argv: list[str],
    variable: str,
    closest: str,
) -> None:
    monkeypatch.setenv(variable, "true")
    assert main(argv) == 2  # type: ignore[operator]
    printed = capsys.readouterr().err
    assert printed.startswith("invalid ")
    assert f"{variable} names no setting: did you mean {closest}?" in printed


def test_every_setting_and_map_key_is_accepted() -> None:
    for settings_cls in (ApplySettings, CaptureSettings):
        names = setting_names(settings_cls)
        assert unknown_variables(settings_cls, dict.fromkeys(names, "x")) == []
        assert unknown_variables(settings_cls, {n.lower(): "x" for n in names}) == []
    maps = {"CAPTURE_KAFKA__PRODUCER__ACKS": "all", "APPLY_SPARK__CONF__X": "1"}
    assert unknown_variables(CaptureSettings, maps) == []
    assert unknown_variables(ApplySettings, maps) == []
    assert "APPLY_KAFKA__REGISTRY__URL" in setting_names(ApplySettings)


def test_a_kubernetes_service_link_is_named_as_one() -> None:
    (problem,) = unknown_variables(CaptureSettings, {"CAPTURE_METRICS_SERVICE_HOST": "10.0.0.1"})
    assert problem == (
        "CAPTURE_METRICS_SERVICE_HOST looks like a Kubernetes service link of a Service named "
        "capture-...: set enableServiceLinks: false on the pod"
    )


def test_other_prefixes_are_left_alone_and_a_far_name_points_at_the_reference() -> None:
    check_environment(ApplySettings, {"CAPTURE_STREAMNG": "on", "CDC_POSTGRES_DSN": "x"})
    with pytest.raises(ConfigError) as raised:
        check_environment(ApplySettings, {"APPLY_ZZZZZZZZZZZZZZ": "1"})
    assert "docs/configuration.md lists every setting" in str(raised.value)


@pytest.mark.parametrize("value", ["true", "false", ""])
def test_the_retired_change_log_is_refused_saying_the_table_is_fresh(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """Whatever its value: a deployment that still sets it learns that the log is gone
    and why, not a near name."""
    monkeypatch.setenv("APPLY_LAKE__CHANGE_LOG", value)
    assert apply_main(["errored"]) == 2
    printed = capsys.readouterr().err
    assert "APPLY_LAKE__CHANGE_LOG is retired: the change log is retired" in printed
    assert "the Delta table itself is fresh" in printed
    assert "did you mean" not in printed


def test_every_retired_setting_is_refused_and_named_by_no_setting() -> None:
    retired = retired_variables(ApplySettings)
    assert set(retired) == {
        "APPLY_LAKE__CHANGE_LOG",
        "APPLY_LAKE__FOLD_EVERY_S",
        "APPLY_LAKE__FOLD_PARALLELISM",
    }
    assert not set(retired) & set(setting_names(ApplySettings))
    problems = unknown_variables(ApplySettings, {"apply_lake__fold_every_s": "2"})
    assert problems == [
        "apply_lake__fold_every_s is retired: it folded the change log, which is retired "
        "(docs/lake-change-log.md); unset it"
    ]
    assert retired_variables(CaptureSettings) == {}
