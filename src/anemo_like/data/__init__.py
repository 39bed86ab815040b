"""Data: the anemoi-datasets zarr reader, the built-in synthetic dataset, normalisation and training samples."""

from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr
from anemo_like.data.zarr_writer import write_anemoi_zarr

__all__ = ["AnemoiZarr", "open_anemoi_zarr", "write_anemoi_zarr"]
