"""Verification scores shared by validation and anemo-infer: CRPS estimators, ensemble score sums and the parts of
the grid they are computed over."""
