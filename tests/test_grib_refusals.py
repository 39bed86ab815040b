"""GRIB output refusals (docs/errors.md, "GRIB output"): each is refused at set-up with one message, checked word
for word against its row, and nothing is written; a path holding a file anemo-infer did not write is left
byte-identical, one holding its own earlier GRIB forecast is replaced. The session's ``skilled`` model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import eccodes
import pytest
from inference_helpers import documented, infer_config, setup_error
from test_grib_output import GRIB_TABLE, messages

from anemo_like.inference.run import run_inference

DATE = "dates=[2000-11-01T00]"


def refusal(skilled: Path, tmp_path: Path, *overrides: str) -> str:
    """The set-up message of a GRIB output with ``overrides``; nothing is written beside it."""
    output = tmp_path / "out" / "forecast.grib"
    message = setup_error(infer_config(skilled, DATE, "lead_time=6h", f"output={output}", *overrides))
    assert not output.parent.exists() or not list(output.parent.iterdir())
    return message


def test_a_variable_without_a_grib_parameter_is_named(skilled, builtin, tmp_path) -> None:
    message = refusal(
        skilled, tmp_path, *[entry for entry in GRIB_TABLE if not entry.startswith("+grib.variables.sp=")]
    )
    assert message == (
        f"no GRIB parameter for the variable(s) sp: none in grib.variables, the variables_metadata of checkpoint "
        f"{skilled}, the variables_metadata of dataset {builtin}; map each in grib.variables, e.g. "
        "'+grib.variables.sp={param: sp, levtype: sfc}'"
    )
    documented(message, FILE=skilled, PATH=builtin)


def test_a_parameter_ecCodes_does_not_know(skilled, tmp_path) -> None:
    table = [entry for entry in GRIB_TABLE if not entry.startswith("+grib.variables.t_850=")]
    message = refusal(skilled, tmp_path, *table, "+grib.variables.t_850={param: nosuch, levtype: pl, levelist: 850}")
    assert message == (
        "variable t_850: ecCodes has no GRIB2 parameter {param: nosuch, levtype: pl, levelist: 850} (Concept no "
        "match); map it in grib.variables to a parameter of ecCodes' table (https://codes.ecmwf.int/grib/param-db/)"
    )
    documented(message)


def test_two_variables_of_one_grib_field_are_refused(skilled, tmp_path) -> None:
    """A table that maps two variables to one field would write two messages of it per step and none of the other."""
    table = [entry for entry in GRIB_TABLE if not entry.startswith("+grib.variables.u_850=")]
    message = refusal(skilled, tmp_path, *table, "+grib.variables.u_850={param: t, levtype: pl, levelist: 850}")
    assert message == (
        "the variables t_850 and u_850 map to one GRIB field (t, levtype pl, level 850), so one would hide the "
        "other; give each its own MARS keys (check grib.variables.t_850 and grib.variables.u_850)"
    )
    documented(message)


def test_encoding_keys_that_leave_unwritable_messages_are_refused_at_setup(skilled, tmp_path) -> None:
    message = refusal(skilled, tmp_path, *GRIB_TABLE, "+grib.encoding.edition=1")
    assert message == (
        "grib.encoding (class='ml', expver='0001', edition=1): ecCodes cannot write anemo-infer's messages with these "
        "keys (Key/value not found); anemo-infer writes GRIB2 with ECMWF's local definition: remove the key that "
        "changes the message's layout (edition, ...)"
    )
    documented(message)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "+grib.encoding.nosuchkey=1",
            "grib.encoding.nosuchkey: ecCodes knows no GRIB key 'nosuchkey'; remove it or use a key of GRIB2 with "
            "ECMWF's local definition 1 (class, stream, expver, centre, ...)",
        ),
        (
            "+grib.encoding.stream=zzzz",
            "grib.encoding.stream='zzzz': ecCodes refuses this value (Encoding invalid); use a value ecCodes accepts",
        ),
        (
            "+grib.encoding.centre=kwbc",
            "grib.encoding.centre='kwbc': ecCodes refuses this value (it has no MARS local definition for class, "
            "stream, type and expver with it; add subCentre: 98 for ECMWF's); use a value ecCodes accepts",
        ),
        (
            "+grib.encoding.type=pf",
            "grib.encoding.type is set by anemo-infer (fc, pf, em or es and the member number, per message); remove "
            "it from grib.encoding",
        ),
    ],
    ids=["unknown-key", "refused-value", "centre-without-local-definition", "reserved-key"],
)
def test_grib_encoding_keys_are_checked_at_setup(skilled, tmp_path, override: str, expected: str) -> None:
    message = refusal(skilled, tmp_path, *GRIB_TABLE, override)
    assert message == expected
    documented(message)


def test_centre_with_ecmwf_local_definition_is_accepted(skilled, tmp_path) -> None:
    output = tmp_path / "f.grib"
    overrides = [DATE, "lead_time=6h", f"output={output}", *GRIB_TABLE, "+grib.encoding.centre=lfpw"]
    run_inference(infer_config(skilled, *overrides, "+grib.encoding.subCentre=98"))
    assert {(m["class"], m["stream"], m["type"]) for m in messages(output)} == {("ml", "oper", "fc")}


def test_only_a_grib_forecast_of_anemo_infer_is_replaced(skilled, tmp_path) -> None:
    foreign = tmp_path / "foreign.grib2"
    handle = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2")
    with open(foreign, "wb") as file:
        eccodes.codes_write(handle, file)
    eccodes.codes_release(handle)
    text = tmp_path / "notes.grb"
    text.write_text("GRIB? no, a text file\n")
    holds = {foreign: "a GRIB file not written by anemo-infer", text: "a file that is not a forecast of anemo-infer"}
    for output, what in holds.items():
        before = output.read_bytes()
        message = setup_error(infer_config(skilled, DATE, f"output={output}", *GRIB_TABLE))
        assert message == (
            f"output {output} holds {what}; anemo-infer only replaces a forecast it wrote itself: remove it yourself "
            "or choose another path (output=...)"
        )
        documented(message, OUT=output)
        assert output.read_bytes() == before
    ours = tmp_path / "again.grib"
    for lead, count in (("6h", 7), ("12h", 14)):  # an earlier GRIB forecast of ours is replaced
        run_inference(infer_config(skilled, DATE, f"lead_time={lead}", f"output={ours}", *GRIB_TABLE))
        assert len(messages(ours)) == count
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.grib", "foreign.grib2", "notes.grb"]


def test_grib_output_without_eccodes_is_refused(tmp_path) -> None:
    output = tmp_path / "forecast.grib"
    script = (
        "import sys; sys.modules['eccodes'] = None\n"  # as if ecCodes were not installed
        "from pathlib import Path\nfrom anemo_like.inference.output import check_output\n"
        f"try:\n    check_output(Path({str(output)!r}))\nexcept ValueError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    message = result.stdout.strip()
    assert message == f"output {output} is GRIB, which needs ecCodes: pip install 'anemo_like[grib]'", result.stderr
    documented(message, OUT=output)
    assert list(tmp_path.iterdir()) == []
