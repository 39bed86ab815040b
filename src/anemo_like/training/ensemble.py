"""Ensemble members in training and validation (``training.ensemble.members``).

A batch of B initial states becomes B * m rows, member-minor (row ``b * m + j`` is member ``first + j`` of sample
``b``), where m of the M members run on this rank: M / ``system.hardware.num_gpus_per_ensemble``, the consecutive
block ``first`` .. ``first + m``. Member ``k``'s processor noise comes from its own generator, seeded by (seed,
stream, step, k, replica) with ``replica`` the data-parallel rank (its samples), so a member's forecast does not
depend on which rank of the ensemble group runs it. The loss gathers every member of
the ensemble group (:func:`anemo_like.models.ops.collectives.gather_nodes` along the member dimension: its backward
sums the gradients of every rank's identical loss, which the world-wide gradient average divides again).

An ensemble dataset gives the members their own initial states: with ``initial_members`` E > 1 a sample holds
the dataset member 0's states followed by the initial states of members 1 .. E - 1
(:class:`anemo_like.data.window_dataset.WindowDataset`), and member k starts from dataset member k mod E; every
member is scored against member 0's states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.member_noise import TRAIN_STREAM, member_noise, member_seed
from anemo_like.models.ops.collectives import gather_nodes
from anemo_like.models.rollout import ForecastSpec, rollout


@dataclass(frozen=True)
class EnsembleMembers:
    """This rank's share of the M members: ``local`` of them from ``first``; ``group``: the ranks sharing them."""

    members: int
    local: int
    first: int
    group: ProcessGroup | None
    seed: int
    replica: int = 0
    initial_members: int = 1  # a sample's initial states of that many dataset members

    @classmethod
    def of(
        cls,
        *,
        members: int,
        group: ProcessGroup | None,
        rank: int,
        size: int,
        seed: int,
        replica: int = 0,
        initial_members: int = 1,
    ) -> EnsembleMembers:
        """Members split evenly over the ``size`` ranks of the ensemble group (``rank``: this rank's place), for the
        samples of data-parallel ``replica``, starting from ``initial_members`` dataset members."""
        if members % size:
            raise ValueError(f"{members} ensemble members cannot be split evenly over {size} ranks")
        local = members // size
        first = rank * local
        return cls(members, local, first, group, seed, replica, initial_members)

    def expand(self, batch: Tensor, multistep: int) -> Tensor:
        """(B, T', G, V) samples -> (B * m, T, G, V) member rows: each sample once per local member, with member k's
        ``multistep`` initial states from dataset member k mod ``initial_members`` (T' = T + (E - 1) * multistep)."""
        if self.initial_members == 1:
            return batch.repeat_interleave(self.local, dim=0)
        states = batch.shape[1] - (self.initial_members - 1) * multistep
        trajectory, later = batch[:, :states], batch[:, multistep:states]
        starts = [trajectory[:, :multistep], *batch[:, states:].split(multistep, dim=1)]
        members = range(self.first, self.first + self.local)
        rows = [torch.cat([starts[k % self.initial_members], later], dim=1) for k in members]
        return torch.stack(rows, dim=1).flatten(0, 1)

    def noise(
        self, shape: tuple[int, int, int] | None, *, stream: int, step: int, device: torch.device
    ) -> Callable[[int], Tensor] | None:
        """:func:`member_noise` of this rank's members for ``step`` of ``stream``."""
        members = range(self.first, self.first + self.local)
        seeds = [member_seed(self.seed, stream, step, k, self.replica) for k in members]
        return member_noise(shape, seeds=seeds, device=device)

    def gather(self, prediction: Tensor) -> Tensor:
        """(B * m, G, V) -> (B, M, G, V): every member of the ensemble group, in member order."""
        local = prediction.unflatten(0, (-1, self.local))
        if self.group is None:
            return local
        return gather_nodes(local, self.group, [self.local] * (self.members // self.local), dim=1)

    def target(self, target: Tensor) -> Tensor:
        """(B * m, G, V) -> (B, G, V): the target of each sample (the same for its members)."""
        return target[:: self.local]


def rollout_loss(
    model: ForecastModel,
    batch: Tensor,
    *,
    spec: ForecastSpec,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    steps: int,
    ensemble: EnsembleMembers | None,
    step: int,
    lead_weights: Sequence[float] = (),
) -> Tensor:
    """The training loss of one batch (B, T, G, V): the mean over ``steps`` rollout steps of ``loss_fn``, of each
    prediction (deterministic) or of every member of the ensemble (``ensemble``; noise of training ``step``).
    ``lead_weights`` (``training.lead_loss_weights``) make it the weighted mean, lead k (1-based) weighted by
    ``lead_weights[min(k, len) - 1]``; empty: the plain mean."""
    weights = lead_fractions(lead_weights, steps)
    loss = torch.zeros((), device=batch.device)
    if ensemble is None:
        for weight, (prediction, target) in zip(weights, rollout(model, batch, spec, steps=steps), strict=True):
            loss = loss + weight(loss_fn(prediction.float(), target.float()))
        return loss
    shape = model.noise_shape(batch.shape[0])
    noise = ensemble.noise(shape, stream=TRAIN_STREAM, step=step, device=batch.device)
    rows = ensemble.expand(batch, spec.multistep)
    pairs = rollout(model, rows, spec, steps=steps, noise=noise)
    for weight, (prediction, target) in zip(weights, pairs, strict=True):
        loss = loss + weight(loss_fn(ensemble.gather(prediction.float()), ensemble.target(target.float())))
    return loss


def lead_fractions(lead_weights: Sequence[float], steps: int) -> list[Callable[[Tensor], Tensor]]:
    """For each of ``steps`` leads, the map from its loss to its share of the rollout loss: loss / steps with no
    ``lead_weights`` (the plain mean), else loss * w_k / sum(w) with w_k = ``lead_weights[min(k, len) - 1]``."""
    if not lead_weights:
        return [lambda loss: loss / steps] * steps
    weights = [lead_weights[min(k, len(lead_weights)) - 1] for k in range(1, steps + 1)]
    total = sum(weights)
    return [lambda loss, share=w / total: loss * share for w in weights]
