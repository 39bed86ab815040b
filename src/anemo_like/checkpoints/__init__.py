"""Checkpoint formats shared by training and inference: the training checkpoint (exact resume) and the inference
checkpoint (weights-only, self-describing)."""
