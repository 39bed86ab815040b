#!/usr/bin/env bash
# Build the Held-Suarez T21 dataset with computed forcings, with the real `anemoi-datasets create`:
#
#   bash tests/data/anemoi/make_forcing_dataset.sh
#
# which runs (with the defaults below; about 20 s on 2 CPU cores):
#
#   /tmp/anemoi-training/venv/bin/anemoi-datasets create <resolved copy of hs_t21_forcings_recipe.yaml> \
#       /tmp/anemoi-training/hs-t21-forcings.zarr
#
# Environment overrides:
#   HS_T21_SOURCE   source dataset        (default: <repo>/../shared/data/hs-t21-seed1-1y.zarr)
#   HS_T21_FORCINGS output dataset        (default: /tmp/anemoi-training/hs-t21-forcings.zarr)
#   ANEMOI_VENV     venv with anemoi-datasets 0.5.47 (default: /tmp/anemoi-training/venv;
#                   made by ../shared/bench/anemoi-training/setup.sh)
#   HS_T21_RECIPE   recipe                (default: hs_t21_forcings_recipe.yaml beside this script)
#
# Idempotent: does nothing if the output already exists and opens with
# anemoi.datasets.open_dataset with the five forcings in it. A broken output is rebuilt.
# The build goes to a temporary folder next to the output and is checked there (same dates
# and grid, the 15 original variables equal to the source's exactly) before it is moved into place.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"

SRC="${HS_T21_SOURCE:-$repo/../shared/data/hs-t21-seed1-1y.zarr}"
OUT="${HS_T21_FORCINGS:-/tmp/anemoi-training/hs-t21-forcings.zarr}"
VENV="${ANEMOI_VENV:-/tmp/anemoi-training/venv}"
RECIPE="${HS_T21_RECIPE:-$here/hs_t21_forcings_recipe.yaml}"
PY="$VENV/bin/python"
CREATE="$VENV/bin/anemoi-datasets"

FORCINGS="cos_julian_day sin_julian_day cos_local_time sin_local_time insolation"

opens() {  # opens DATASET: true if open_dataset reads it and it has the forcings
    "$PY" - "$1" $FORCINGS >/dev/null 2>&1 <<'PYEOF'
import sys
from anemoi.datasets import open_dataset
ds = open_dataset(sys.argv[1])
missing = set(sys.argv[2:]) - set(ds.variables)
assert not missing, missing
assert ds.shape[0] > 0
PYEOF
}

if [ -e "$OUT" ] && opens "$OUT"; then
    echo "$OUT exists and opens; nothing to do."
    exit 0
fi

[ -x "$CREATE" ] || { echo "no $CREATE: run bash ../shared/bench/anemoi-training/setup.sh" >&2; exit 1; }
[ -d "$SRC" ] || { echo "no source dataset $SRC (set HS_T21_SOURCE)" >&2; exit 1; }
SRC="$(cd "$SRC" && pwd)"

mkdir -p "$(dirname "$OUT")"
tmp_dir="$(mktemp -d "$(dirname "$OUT")/.make_forcing_dataset.XXXXXX")"
trap 'rm -rf "$tmp_dir"' EXIT

# The recipe names the source by an absolute path: substitute the one in use.
"$PY" - "$RECIPE" "$SRC" "$tmp_dir/recipe.yaml" <<'PYEOF'
import sys
import yaml
recipe_in, src, recipe_out = sys.argv[1:]
with open(recipe_in) as f:
    recipe = yaml.safe_load(f)
recipe["input"]["join"][0]["anemoi-dataset"]["dataset"] = src
with open(recipe_out, "w") as f:
    yaml.safe_dump(recipe, f, sort_keys=False)
PYEOF

build="$tmp_dir/hs-t21-forcings.zarr"
log="$tmp_dir/create.log"
echo "anemoi-datasets create $tmp_dir/recipe.yaml -> $OUT (source $SRC)"
if ! "$CREATE" create "$tmp_dir/recipe.yaml" "$build" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "anemoi-datasets create failed" >&2
    exit 1
fi

# Check before moving into place: same dates and grid, 15 originals bit-for-bit, forcings present.
"$PY" - "$build" "$SRC" $FORCINGS <<'PYEOF'
import sys
import numpy as np
from anemoi.datasets import open_dataset
out, src, forcings = sys.argv[1], sys.argv[2], sys.argv[3:]
a, s = open_dataset(out), open_dataset(src)
assert np.array_equal(a.dates, s.dates), "dates differ"
assert np.array_equal(a.latitudes, s.latitudes) and np.array_equal(a.longitudes, s.longitudes), "grid differs"
A, S = a.data[:], s.data[:]
for v in s.variables:
    assert np.array_equal(A[:, a.name_to_index[v]], S[:, s.name_to_index[v]]), f"{v} differs from the source"
for f in forcings:
    meta = a.variables_metadata[f]
    assert meta.get("computed_forcing") is True and meta.get("constant_in_time") is False, (f, meta)
print(f"ok: {a.shape}, variables {a.variables}")
PYEOF

if [ -e "$OUT" ]; then
    # Exists but did not open: replace it only if it looks like a (broken) zarr store.
    if [ -d "$OUT" ] && { [ -e "$OUT/.zgroup" ] || [ -e "$OUT/.zattrs" ] || [ -z "$(ls -A "$OUT")" ]; }; then
        rm -rf "$OUT"
    else
        echo "$OUT exists and is not a zarr store; not replacing it" >&2
        exit 1
    fi
fi
mv "$build" "$OUT"
echo "wrote $OUT"
