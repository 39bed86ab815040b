"""Reading and writing anemoi-datasets zarr archives (format v2 and v3): data.zarr_store and data.zarr_writer."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import zarr

from anemo_like.data import zarr_store, zarr_writer
from anemo_like.data.zarr_store import open_anemoi_zarr, parse_frequency
from anemo_like.data.zarr_writer import write_anemoi_zarr

SHARED_DATASET = Path(__file__).resolve().parents[2] / "shared" / "data" / "hs-t21-seed1-1y.zarr"
VARIABLES = ["t_850", "u_850", "z_500"]
N_DATES, N_GRID = 10, 6
FIRST = np.datetime64("2001-01-01T00:00:00", "s")
DATES = FIRST + np.arange(N_DATES) * np.timedelta64(6, "h")


def source_data() -> np.ndarray:
    """(dates, variables, ensembles, grid) float32 with a distinct value at every position."""
    rng = np.random.default_rng(0)
    scale = np.array([10.0, 5.0, 1000.0])[None, :, None, None]
    offset = np.array([280.0, 0.0, 54000.0])[None, :, None, None]
    return (rng.normal(size=(N_DATES, len(VARIABLES), 1, N_GRID)) * scale + offset).astype(np.float32)


def write(path: Path, zarr_format: int = 2, **overrides) -> Path:
    kwargs = {
        "data": source_data(),
        "variables": VARIABLES,
        "dates": DATES,
        "latitudes": np.linspace(-75.0, 75.0, N_GRID),
        "longitudes": np.linspace(0.0, 300.0, N_GRID),
        "frequency": "6h",
        "zarr_format": zarr_format,
    }
    return write_anemoi_zarr(path, **{**kwargs, **overrides})


@pytest.fixture(params=[2, 3], ids=["zarr-v2", "zarr-v3"])
def store_path(request, tmp_path) -> Path:
    return write(tmp_path / "small.zarr", zarr_format=request.param)


# ------------------------------------------------------------------------------------------- round trip
def test_round_trip_metadata_values_and_statistics(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    data = source_data()
    assert store.path == store_path
    assert store.variables == VARIABLES
    assert store.frequency == datetime.timedelta(hours=6)
    assert store.dates.dtype == np.dtype("datetime64[s]")
    np.testing.assert_array_equal(store.dates, DATES)
    np.testing.assert_array_equal(store.latitudes, np.linspace(-75.0, 75.0, N_GRID))
    np.testing.assert_array_equal(store.longitudes, np.linspace(0.0, 300.0, N_GRID))
    assert store.shape == (N_DATES, len(VARIABLES), 1, N_GRID)
    assert store.attrs["start_date"] == "2001-01-01T00:00:00"
    assert store.attrs["end_date"] == str(DATES[-1])

    values = store.read(slice(None), np.arange(len(VARIABLES)))
    assert values.dtype == np.float32 and values.shape == (N_DATES, len(VARIABLES), N_GRID)
    np.testing.assert_array_equal(values, data[:, :, 0])

    per_variable = data.astype(np.float64).transpose(1, 0, 2, 3).reshape(len(VARIABLES), -1)
    expected = {
        "mean": per_variable.mean(1),
        "stdev": per_variable.std(1),
        "minimum": per_variable.min(1),
        "maximum": per_variable.max(1),
    }
    for key, value in expected.items():
        assert store.statistics[key].dtype == np.float64
        np.testing.assert_allclose(store.statistics[key], value, rtol=1e-12)


def test_zarr_format_on_disk_and_one_date_per_chunk(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    if store.zarr_format == 2:
        assert (store_path / ".zgroup").exists()
        meta = json.loads((store_path / "data" / ".zarray").read_text())
        assert meta["compressor"]["id"] == "blosc"
        assert meta["dtype"] == "<f4"
        assert (store_path / "data" / "9.0.0.0").is_file()
    else:
        assert json.loads((store_path / "zarr.json").read_text())["zarr_format"] == 3
        assert (store_path / "data" / "c.9.0.0.0").is_file()  # flat chunk files, not a folder per date
    assert zarr.open_group(store_path, mode="r")["data"].chunks == (1, len(VARIABLES), 1, N_GRID)


@pytest.mark.parametrize(
    ("text", "hours"), [("6h", 6), ("1h", 1), ("30m", 0.5), ("30min", 0.5), ("1d", 24), ("6H", 6), (6, 6)]
)
def test_frequency_forms(text, hours) -> None:
    assert parse_frequency(text) == datetime.timedelta(hours=hours)


def test_old_integer_frequency_attribute_is_read_as_hours(tmp_path) -> None:
    path = write(tmp_path / "old.zarr")
    zarr.open_group(path, mode="r+").attrs["frequency"] = 6
    assert open_anemoi_zarr(path).frequency == datetime.timedelta(hours=6)


def test_thirty_minute_dataset(tmp_path) -> None:
    dates = FIRST + np.arange(N_DATES) * np.timedelta64(30, "m")
    store = open_anemoi_zarr(write(tmp_path / "fast.zarr", dates=dates, frequency="30m"))
    assert store.frequency == datetime.timedelta(minutes=30)
    assert store.attrs["frequency"] == "30m"


# ------------------------------------------------------------------------------------ selection and windows
def test_variables_are_selected_by_name_in_requested_order(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    index = store.variable_indices(["z_500", "t_850"])
    np.testing.assert_array_equal(index, [2, 0])
    np.testing.assert_array_equal(store.read(slice(2, 5), index), source_data()[2:5][:, [2, 0], 0])


def test_date_range_is_inclusive_of_both_dates(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    assert store.date_range(None, None) == (0, N_DATES)
    assert store.date_range(DATES[2], DATES[5]) == (2, 6)
    assert store.date_range("2001-01-01T06:00:00", "2001-01-01T18") == (1, 4)
    assert store.date_range(None, "2001-01-02") == (0, 8)  # day precision: the whole of 2 January
    assert store.date_range("2001-01", None) == (0, N_DATES)
    assert store.date_range(DATES[-1], None) == (N_DATES - 1, N_DATES)


def test_read_of_a_window_equals_numpy_slicing(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    start, stop = store.date_range(DATES[3], DATES[7])
    index = store.variable_indices(["u_850", "z_500"])
    expected = source_data()[start:stop, [1, 2], 0, 1:4]
    np.testing.assert_array_equal(store.read(slice(start, stop), index, grid=slice(1, 4)), expected)
    strided = source_data()[1:9:2, [1, 2], 0]
    np.testing.assert_array_equal(store.read(slice(1, 9, 2), index), strided)


def test_open_and_read_touch_only_the_requested_date_chunks(tmp_path) -> None:
    path = write(tmp_path / "a.zarr")
    (path / "data" / "5.0.0.0").write_bytes(b"not a blosc chunk")
    store = open_anemoi_zarr(path)
    np.testing.assert_array_equal(store.read(slice(0, 5), np.arange(3)), source_data()[:5, :, 0])
    np.testing.assert_array_equal(store.read(slice(6, 10), np.arange(3)), source_data()[6:, :, 0])
    with pytest.raises(zarr_store.CorruptDatasetError, match=r"5\.0\.0\.0: cannot decode this chunk .*blosc"):
        store.read(slice(5, 6), np.arange(3))


# ------------------------------------------------------------------------------------------- errors
def test_unknown_variable_names_the_variable_the_file_and_a_suggestion(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    with pytest.raises(ValueError, match="unknown variable") as error:
        store.variable_indices(["t_850", "t850", "q_700"])
    message = str(error.value)
    assert "'t850'" in message and "did you mean 't_850'" in message and "'q_700'" in message
    assert str(store_path) in message and "available: t_850, u_850, z_500" in message


@pytest.mark.parametrize(("start", "end"), [("2000-12-31T18", None), (None, "2001-01-03T12"), ("2001-02", None)])
def test_date_outside_the_dataset_names_the_file_and_its_dates(store_path, start, end) -> None:
    store = open_anemoi_zarr(store_path)
    with pytest.raises(ValueError, match="outside the dataset") as error:
        store.date_range(start, end)
    assert str(store_path) in str(error.value)
    assert "2001-01-01T00:00:00 .. 2001-01-03T06:00:00" in str(error.value)


def test_unparsable_date_names_the_file(store_path) -> None:
    with pytest.raises(ValueError, match="cannot parse date 'yesterday'") as error:
        open_anemoi_zarr(store_path).date_range("yesterday", None)
    assert str(store_path) in str(error.value)


def test_empty_window_is_an_error(store_path) -> None:
    with pytest.raises(ValueError, match="no dates"):
        open_anemoi_zarr(store_path).date_range(DATES[5], DATES[2])


def test_missing_path_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.zarr"):
        open_anemoi_zarr(tmp_path / "nothere.zarr")


def test_folder_that_is_not_a_zarr_group(tmp_path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a zarr group"):
        open_anemoi_zarr(tmp_path / "plain")


def test_missing_data_array_names_the_key(store_path) -> None:
    zarr.open_group(store_path, mode="r+").__delitem__("data")
    with pytest.raises(ValueError, match="'data' array is missing") as error:
        open_anemoi_zarr(store_path)
    assert str(store_path) in str(error.value)


def test_missing_attribute_names_the_key(tmp_path) -> None:
    path = write(tmp_path / "a.zarr")
    group = zarr.open_group(path, mode="r+")
    del group.attrs["variables"]
    with pytest.raises(ValueError, match="'variables' group attribute is missing"):
        open_anemoi_zarr(path)


def test_variables_not_matching_data_shape(tmp_path) -> None:
    path = write(tmp_path / "a.zarr")
    zarr.open_group(path, mode="r+").attrs["variables"] = ["t_850", "u_850"]
    with pytest.raises(ValueError, match="lists 2 names but 'data' has 3 variables"):
        open_anemoi_zarr(path)


def test_latitudes_not_matching_grid(tmp_path) -> None:
    path = write(tmp_path / "a.zarr")
    group = zarr.open_group(path, mode="r+")
    del group["latitudes"]
    group.create_array("latitudes", data=np.zeros(N_GRID + 1))
    with pytest.raises(ValueError, match=r"'latitudes' has shape \(7,\); expected \(6,\)"):
        open_anemoi_zarr(path)


def test_dates_with_a_gap_are_refused_when_reading_and_writing(tmp_path) -> None:
    path = write(tmp_path / "a.zarr")
    gap = DATES.copy()
    gap[5:] += np.timedelta64(6, "h")
    zarr.open_group(path, mode="r+")["dates"][...] = gap
    with pytest.raises(ValueError, match="without gaps; found 2001-01-02T00:00:00 followed by 2001-01-02T12"):
        open_anemoi_zarr(path)
    with pytest.raises(ValueError, match="'dates' must increase"):
        write(tmp_path / "b.zarr", dates=gap)
    assert not (tmp_path / "b.zarr").exists()


def test_write_checks_shapes(tmp_path) -> None:
    with pytest.raises(ValueError, match="'latitudes' has length 5; expected 6"):
        write(tmp_path / "a.zarr", latitudes=np.zeros(5))
    with pytest.raises(ValueError, match="expected 4 dims"):
        write(tmp_path / "a.zarr", data=source_data()[:, :, 0])


def test_write_never_leaves_a_partial_dataset(tmp_path, monkeypatch) -> None:
    def crash(data):
        raise RuntimeError("disk full")

    monkeypatch.setattr(zarr_writer, "compute_statistics", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        write(tmp_path / "a.zarr")
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_to_overwrite(store_path) -> None:
    with pytest.raises(FileExistsError):
        write(store_path)


# ------------------------------------------------------------------------------------------- pickling
def test_pickled_store_reopens_its_own_handle(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    index = store.variable_indices(VARIABLES)
    first = store.read(slice(0, 4), index)
    assert store._handle is not None
    blob = pickle.dumps(store)
    copy = pickle.loads(blob)
    assert copy._handle is None
    assert len(blob) < 20_000
    np.testing.assert_array_equal(copy.read(slice(0, 4), index), first)
    assert copy.variables == store.variables and copy.frequency == store.frequency
    np.testing.assert_array_equal(copy.dates, store.dates)


# ------------------------------------------------------------------------------------------- real dataset
@pytest.mark.skipif(not SHARED_DATASET.exists(), reason=f"shared dataset not present at {SHARED_DATASET}")
def test_reads_the_real_anemoi_datasets_archive() -> None:
    store = open_anemoi_zarr(SHARED_DATASET)
    assert store.zarr_format == 2
    assert store.shape == (1460, 15, 1, 2048)
    assert store.variables == [
        "cos_latitude",
        "cos_longitude",
        "sin_latitude",
        "sin_longitude",
        "sp",
        "t_250",
        "t_500",
        "t_850",
        "u_250",
        "u_500",
        "u_850",
        "v_250",
        "v_500",
        "v_850",
        "z_500",
    ]
    assert store.frequency == datetime.timedelta(hours=6)
    assert store.dates[0] == np.datetime64("2000-01-01T00:00:00")
    assert store.dates[-1] == np.datetime64("2000-12-30T18:00:00")
    assert store.date_range("2000-03", "2000-03") == (240, 364)
    sp = store.read(slice(100, 102), store.variable_indices(["sp"]))
    assert sp.shape == (2, 1, 2048)
    assert sp.min() > 9.0e4 and sp.max() < 1.1e5
    assert 9.9e4 < store.statistics["mean"][4] < 1.01e5
    assert -90 < store.latitudes.min() < -85 and 85 < store.latitudes.max() < 90


def test_forked_child_reopens_the_inherited_handle(store_path) -> None:
    store = open_anemoi_zarr(store_path)
    index = store.variable_indices(VARIABLES)
    expected = store.read(slice(0, 3), index)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, index, queue))  # fork: inherited, not pickled
    child.start()
    inherited_pid, pid_after_read, values = queue.get(timeout=60)
    child.join(timeout=60)
    assert inherited_pid == os.getpid() and pid_after_read == child.pid
    np.testing.assert_array_equal(values, expected)


def _read_in_child(store, index, queue) -> None:
    inherited_pid = store._handle[0]
    values = store.read(slice(0, 3), index)
    queue.put((inherited_pid, store._handle[0], values))
