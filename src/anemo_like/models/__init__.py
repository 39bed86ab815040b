"""Model: graph-transformer encoder, processor (graph transformer or sliding-window transformer) and decoder."""

from anemo_like.models.forecast_model import ForecastModel, VariableLayout

__all__ = ["ForecastModel", "VariableLayout"]
