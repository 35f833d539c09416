"""``streaming.StreamingDataset`` delivering cropbench's sample dicts (imports MosaicML streaming)."""

from __future__ import annotations

from typing import Any

from streaming import StreamingDataset

from cropbench.data.training.base import sample


class MdsCrops(StreamingDataset):
    """MosaicML's StreamingDataset over an MDS crop store; each item as cropbench's sample dict."""

    def __init__(self, *, plate_name: str, **settings: Any) -> None:
        super().__init__(**settings)
        self.plate_name = plate_name

    def get_item(self, sample_id: int, retry: int = 7) -> dict[str, Any]:
        item = super().get_item(sample_id, retry)
        return sample(item["image"], item["meta"], self.plate_name)
