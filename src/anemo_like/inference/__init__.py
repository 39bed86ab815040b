"""Inference: load an inference checkpoint and run the model."""

from anemo_like.inference.checkpoint import InferenceBundle, load_inference_checkpoint, save_inference_checkpoint

__all__ = ["InferenceBundle", "load_inference_checkpoint", "save_inference_checkpoint"]
