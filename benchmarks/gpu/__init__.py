"""The GPU proof kit (make gpu-check): every GPU path, ours against the anchor, profiles, the wheels it needs."""
