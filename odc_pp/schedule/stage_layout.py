"""Which decoder layers each virtual stage holds: the one owner of the layer layout.

:class:`StageLayout` is made once from (``num_layers``, ``pp``, ``num_chunks``, ``first``,
``last``) and answers :meth:`~StageLayout.layers` (global layer indices, Megatron's, so
parameter names stay the same for any layout) and :meth:`~StageLayout.counts`.

Uneven stages (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``)
follow megatron-core's ``get_num_layers_to_build`` / ``get_transformer_layer_offset``: the
first pipeline stage holds ``first`` layers, the last ``last``, the middle stages share
the rest evenly. With several model chunks per rank each of a stage's chunks holds its
stage's layers / ``num_chunks``; virtual stage ``s`` (model order) is in position
``s % pp`` of its round, as Megatron's interleaved numbering (``chunk * pp + rank``).
The V placement numbers its virtual stages the same way, so every placement gives the
same layers to the same virtual stage as Megatron's interleaved schedule would.

Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
(megatron-core's ``account_for_embedding_in_pipeline_split`` /
``account_for_loss_in_pipeline_split``) count the embedding / the loss as one more layer:
``num_layers`` plus the layers accounted splits evenly over the ``pp * num_chunks``
virtual stages (it must divide by ``pp``, and each rank's share by ``num_chunks``), then
the first virtual stage (rank 0's first chunk) holds one decoder layer fewer for the
embedding and the last (the last rank's last chunk) one fewer for the loss -- possibly
none. They cannot be combined with the first/last-stage flags (megatron-core refuses it).

Without any flag: an even split, earlier stages taking the remainder.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StageLayout"]

_FIRST = "--decoder-first-pipeline-num-layers"
_LAST = "--decoder-last-pipeline-num-layers"
_EMBEDDING = "--account-for-embedding-in-pipeline-split"
_LOSS = "--account-for-loss-in-pipeline-split"


@dataclass(frozen=True, kw_only=True)
class StageLayout:
    """The decoder layers of every virtual stage (made by :meth:`resolve`)."""

    num_layers: int
    """Decoder layers of the whole model."""
    pp: int
    """Pipeline ranks."""
    num_chunks: int = 1
    """Model chunks per pipeline rank (virtual stages: ``pp * num_chunks``)."""
    first: int | None = None
    """Layers of the first pipeline stage, over all its chunks (None: not uneven)."""
    last: int | None = None
    """Layers of the last pipeline stage, over all its chunks (None: not uneven)."""
    account_embedding: bool = False
    """The embedding counts as one layer of the split: the first virtual stage holds one
    decoder layer fewer (--account-for-embedding-in-pipeline-split)."""
    account_loss: bool = False
    """The loss counts as one layer of the split: the last virtual stage holds one
    decoder layer fewer (--account-for-loss-in-pipeline-split)."""

    @classmethod
    def resolve(cls, num_layers: int, pp: int, num_chunks: int = 1, *,
                first: int | None = None, last: int | None = None,
                account_embedding: bool = False,
                account_loss: bool = False) -> StageLayout:
        """The layout, checked as megatron-core's TransformerConfig checks it; a
        ValueError naming the flags otherwise."""
        layout = cls(num_layers=num_layers, pp=pp, num_chunks=num_chunks, first=first,
                     last=last, account_embedding=account_embedding,
                     account_loss=account_loss)
        layout._check()
        return layout

    @classmethod
    def even(cls, num_layers: int, num_stages: int) -> StageLayout:
        """``num_layers`` split over ``num_stages`` virtual stages (one rank's view)."""
        return cls.resolve(num_layers, num_stages)

    @property
    def uneven(self) -> bool:
        """Whether --decoder-first/last-pipeline-num-layers or the embedding / loss
        accounted in the split shape the stages."""
        return self.first is not None or self.last is not None or self.accounted

    @property
    def accounted(self) -> bool:
        """Whether the embedding or the loss counts as a layer of the split."""
        return self.account_embedding or self.account_loss

    @property
    def flags(self) -> list[str]:
        """The training flags giving this layout's stages (besides --num-layers, the
        pipeline size and --num-model-chunks)."""
        out = []
        for flag, value in ((_FIRST, self.first), (_LAST, self.last)):
            if value is not None:
                out += [flag, str(value)]
        return out + [flag for flag, on in ((_EMBEDDING, self.account_embedding),
                                            (_LOSS, self.account_loss)) if on]

    @property
    def num_stages(self) -> int:
        """Virtual stages of the pipeline."""
        return self.pp * self.num_chunks

    def counts(self) -> tuple[int, ...]:
        """Layers of each virtual stage, in model order."""
        if self.accounted:
            each = self._accounted_total() // self.num_stages
            counts = [each] * self.num_stages
            counts[0] -= self.account_embedding
            counts[-1] -= self.account_loss
            return tuple(counts)
        if not self.uneven:
            base, extra = divmod(self.num_layers, self.num_stages)
            return tuple(base + (1 if s < extra else 0) for s in range(self.num_stages))
        return tuple(self._rank_layers(s % self.pp) // self.num_chunks
                     for s in range(self.num_stages))

    def layers(self, stage: int) -> range:
        """Global decoder layers of virtual ``stage``."""
        counts = self.counts()
        if not 0 <= stage < len(counts):
            raise ValueError(f"stage {stage} outside 0..{len(counts) - 1}")
        start = sum(counts[:stage])
        return range(start, start + counts[stage])

    def relative_sizes(self) -> tuple[float, ...]:
        """Each virtual stage's layers over the mean: the factor scaling its compute
        (1.0 everywhere for an even split)."""
        counts = self.counts()
        mean = self.num_layers / len(counts)
        return tuple(count / mean for count in counts)

    def _middle(self) -> tuple[int, int]:
        """(layers, pipeline stages) left for the middle stages."""
        layers, stages = self.num_layers, self.pp
        for value in (self.first, self.last):
            if value is not None:
                layers, stages = layers - value, stages - 1
        return layers, stages

    def _rank_layers(self, rank: int) -> int:
        """Layers of pipeline ``rank`` over all its chunks (uneven layouts)."""
        if rank == 0 and self.first is not None:
            return self.first
        if rank == self.pp - 1 and self.last is not None:
            return self.last
        layers, stages = self._middle()
        return layers // stages

    def _accounted_total(self) -> int:
        """--num-layers plus the embedding and loss layers counted in the split."""
        return self.num_layers + self.account_embedding + self.account_loss

    def _check_accounted(self) -> None:
        """megatron-core's checks of the embedding / loss accounted in the split."""
        named = " and ".join(flag for flag, on in ((_EMBEDDING, self.account_embedding),
                                                   (_LOSS, self.account_loss)) if on)
        if self.first is not None or self.last is not None:
            raise ValueError(f"{named} cannot be combined with {_FIRST} / {_LAST} "
                             "(megatron-core refuses both at once): give one or the other")
        total = self._accounted_total()
        if total % self.pp:
            raise ValueError(
                f"--num-layers {self.num_layers} + {total - self.num_layers} (the layers "
                f"{named} counts) = {total} must be divisible by "
                f"--pipeline-model-parallel-size {self.pp}")
        if (total // self.pp) % self.num_chunks:
            raise ValueError(
                f"--num-layers {self.num_layers} with {named}: the {total // self.pp} "
                f"layers of each pipeline rank must be divisible by the model chunks per "
                f"rank ({self.num_chunks}, --num-model-chunks)")

    def _check(self) -> None:
        if self.num_chunks < 1:
            raise ValueError("--num-model-chunks must be >= 1")
        if self.num_layers < 1:
            raise ValueError(f"--num-layers must be >= 1 (got {self.num_layers})")
        if self.accounted:
            self._check_accounted()
            return
        if not self.uneven:
            if self.num_layers < self.num_stages:
                raise ValueError(
                    f"{self.num_layers} layers cannot fill {self.num_stages} stages; use at "
                    "least one layer per stage (pp * num_chunks <= num_layers)")
            return
        if self.pp < 2:
            raise ValueError(f"{_FIRST} / {_LAST} need --pipeline-model-parallel-size >= 2 "
                             f"(got {self.pp})")
        for flag, value in ((_FIRST, self.first), (_LAST, self.last)):
            if value is None:
                continue
            if value <= 0:
                raise ValueError(f"{flag} {value} must be larger than 0")
            if value % self.num_chunks:
                raise ValueError(f"{flag} {value} must be divisible by the model chunks per "
                                 f"rank ({self.num_chunks}, virtual pipeline size)")
        layers, stages = self._middle()
        if layers < 0 or bool(layers) != bool(stages):
            raise ValueError(
                f"--num-layers {self.num_layers} with {_FIRST} {self.first} and {_LAST} "
                f"{self.last}: {layers} middle layers remain for {stages} middle pipeline "
                "stages")
        if stages and layers % (stages * self.num_chunks):
            raise ValueError(
                f"--num-layers {self.num_layers} with {_FIRST} {self.first} and {_LAST} "
                f"{self.last}: the {layers} middle layers must divide by the {stages} middle "
                f"pipeline stages x {self.num_chunks} model chunks")
