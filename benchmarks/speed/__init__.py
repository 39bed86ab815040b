"""Step time, memory and host work of one training step; attention backends; loading, tracking and GRIB costs."""
