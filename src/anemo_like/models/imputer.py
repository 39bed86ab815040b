"""Missing inputs (NaN) replaced by a fixed normalised value, and the outputs of those variables missing again where
their input was (anemoi's InputImputer / ConstantImputer, e.g. sea-surface temperature over land)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Imputer(nn.Module):
    """Fills NaN of the ``imputed`` input variables (input position -> normalised value) in every input state, and
    sets NaN in the ``restored`` outputs (output position -> input position) where that input was NaN in the first
    input state. Its buffers derive from the layout, which checkpoints store, so they are not saved."""

    def __init__(self, *, imputed: dict[int, float], restored: dict[int, int], device: torch.device) -> None:
        super().__init__()
        inputs, outputs = sorted(imputed), sorted(restored)
        buffers = {
            "fill_index": (inputs, torch.long),
            "fill_value": ([imputed[p] for p in inputs], torch.float32),
            "restore_output": (outputs, torch.long),
            "restore_input": ([restored[p] for p in outputs], torch.long),
        }
        for name, (values, dtype) in buffers.items():
            self.register_buffer(name, torch.tensor(values, dtype=dtype, device=device), persistent=False)

    def fill(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, T, G, V_in) -> x with its imputed variables' NaN filled, and the (B, G, V_restored) bool mask of the
        restored outputs' inputs missing in the first input state."""
        columns = x.index_select(-1, self.fill_index)
        missing = columns.isnan()
        filled = torch.where(missing, self.fill_value.to(x.dtype), columns)
        where = torch.searchsorted(self.fill_index, self.restore_input)  # each restored input's imputed column
        return x.index_copy(-1, self.fill_index, filled), missing[:, 0].index_select(-1, where)

    def restore(self, out: Tensor, missing: Tensor) -> Tensor:
        """out: (B, G, V_out) or (B, K, G, V_out) -> the same with NaN where ``missing`` (B, G, V_restored)."""
        if not len(self.restore_output):
            return out
        if out.dim() == 4:
            missing = missing.unsqueeze(1).expand(-1, out.shape[1], -1, -1)
        columns = out.index_select(-1, self.restore_output)
        return out.index_copy(-1, self.restore_output, columns.masked_fill(missing, torch.nan))
