"""Model: graph-transformer encoder, processor (graph transformer or sliding-window transformer) and decoder."""

from anemo_like.data.variables import VariableLayout
from anemo_like.models.forecast_model import ForecastModel

__all__ = ["ForecastModel", "VariableLayout"]
