"""The framework's generation cells as the engine's graphs (mindvl.engine.decode_loop): a prefill cell (a text
prompt's Prefill, or a multimodal prompt's MultimodalPrefill) and the decoder's Decode cell, in graph mode."""
from typing import Any, List, Sequence, Tuple

import numpy as np
from mindspore import Tensor

from mindvl.cells.decoder import Decode
from mindvl.engine.package_graphs import EXTEND_STEPS, WIDE_ROWS
from mindvl.engine.prompts import PromptBatch
from mindvl.package_reader import as_array, as_tensor


class CellGraphs:
    """prefill: cells.decoder.Prefill (ids, valid), cells.multimodal_lm.MultimodalPrefill (ids, valid,
    slot_index, image, mel, frame_mask) or cells.native_vlm.NativePrefill (ids, valid, positions, slot_index,
    mel and frame_mask where it hears, the vision inputs); decode: cells.decoder.Decode. The caches stay MindSpore tensors
    between steps; rows the engine joined, and a wide step's new rows (its cell returns those: cells.decoder
    CausalLM.decode's `beside`), are written through the tensors' memory as arrays, which go in sharing it."""

    to_numpy = staticmethod(as_array)
    extend_steps = EXTEND_STEPS  # the decode cell compiles a second graph for several tokens a row (same weights)

    def __init__(self, prefill_cell, decode_cell: Decode):
        self.prefill_cell = prefill_cell
        self.decode_cell = decode_cell
        self.wide_cell = Decode(decode_cell.lm, wide=True)  # WIDE_ROWS rows or more (engine.package_graphs)

    def prefill(self, batch: PromptBatch) -> Tuple[np.ndarray, List[Any]]:
        inputs = [batch.ids, batch.valid]
        if batch.positions is not None:  # a native-resolution VLM's (cells.native_vlm.NativePrefill)
            speech = [batch.mel, batch.frame_mask] if batch.mel is not None else []  # a model that hears
            inputs += [batch.positions, batch.slot_index, *speech, *batch.vision]
        elif batch.multimodal:
            inputs += [batch.slot_index, batch.image, batch.mel, batch.frame_mask]
        logits, keys, values = self.prefill_cell(*(Tensor(a) for a in inputs))
        return logits.asnumpy(), [*keys, *values]

    def decode(self, token: np.ndarray, position: np.ndarray, slot: np.ndarray, slot_valid: np.ndarray,
               caches: Sequence[Any]) -> Tuple[np.ndarray, List[Any]]:
        cell = self.wide_cell if token.shape[1] == 1 and len(token) >= WIDE_ROWS else self.decode_cell
        logits, keys, values = cell(Tensor(token), Tensor(position), Tensor(slot), Tensor(slot_valid.astype(bool)),
                                    *(as_tensor(c) for c in caches))
        return logits.asnumpy(), [*keys, *values]
