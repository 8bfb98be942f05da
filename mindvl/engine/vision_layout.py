"""Where each patch of a batch of native-resolution images goes, computed on the host: the graphs take a packed
sequence of every image's patches and the integers below, never a padded image per slot.

For images (or video clips) of patch grids (t, h, w), in the processor's merge-block order (the patches of each
merge x merge block consecutive, `mindvl.preprocess.native_resolution.patches`):

- **window order**: Qwen2.5-VL's windowed layers attend within windows of `window` x `window` merged blocks of a
  frame (112 px: 4 x 4 blocks); the patches are reordered window by window (each window's blocks row by row, a
  partial window at the right or bottom edge holding fewer), so that a window is a run of the sequence. Qwen2-VL
  has no windows (window 0): the order is the processor's.
- **positions** (h, w) of every patch in that order: the 2D rotary's.
- **segments**: per patch, the frame it belongs to (the full-attention layers attend within a frame) and the
  window (the windowed layers), numbered 1.. over the whole batch; 0 marks padding up to a bucket.
- **restore**: for each merged token in the processor's order, its row in window order (the merger's output is
  gathered back by it, so the language model sees every image's tokens row by row).
- **window rows** (`window_rows=True`): each window padded to window x window blocks with empty patches (order
  -1, segment 0), so that a windowed layer runs over (windows, window^2 x merge^2) rows, each attending within
  itself, instead of one (patches x patches) masked product: the windowed layers (28 of Qwen2.5-VL-7B's 32) then
  cost what their windows cost.

A ViT with a CLS token and a learned position table (DINOv2 as a native-resolution encoder) takes its images
otherwise (`PackedViTLayout`): each image its CLS row, then its patches in merge-block order. The two ways are
`WindowedPacking` and `ViTPacking`, one interface: what the prompts, the training packer and the exported
graphs ask of a tower (the patches a batch takes laid out, and the tower's inputs, by name).
"""
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

import numpy as np

from mindvl.engine.position_table import position_weights
from mindvl.errors import InputError


@dataclass
class VisionLayout:
    """A batch's packed patches laid out (see the module docstring); `order` (patches,): each window-order
    patch's row in the processor's order (the patches are gathered by it before the graph)."""

    order: np.ndarray
    positions: np.ndarray  # (patches, 2) int32: (h, w)
    frames: np.ndarray  # (patches,) int32: 1.. the frame a patch is in; 0 padding
    windows: np.ndarray  # (patches,) int32: 1.. the window a patch is in; 0 padding
    restore: np.ndarray  # (merged tokens,) int32
    tokens_per_item: List[int]  # merged tokens of each image or clip, in order
    row: int = 0  # patches per window row (window_rows), 0: the windows are not padded to rows

    @property
    def patches(self) -> int:
        return len(self.order)

    def graph_inputs(self, patches: np.ndarray, bucket: int = 0):
        """The tower's inputs for `patches` (the packed processor-order patches, (patches, values)): patches,
        positions, frames, windows (each with a batch axis of 1) and restore, padded to `bucket` patches (0: as
        many as there are) with zero patches of segment 0, which no real patch attends to."""
        size, multiple = bucket or self.patches, self.row or 4
        if size < self.patches or size % multiple:
            raise InputError(f"a vision bucket of {size} patches for {self.patches}: expected a multiple of {multiple} "
                             f"at least as large")
        pad = size - self.patches
        with_empty = np.concatenate([patches, np.zeros((1, patches.shape[1]), patches.dtype)])  # order -1: empty
        ordered = np.concatenate([with_empty[self.order], np.zeros((pad, patches.shape[1]), patches.dtype)])
        return (ordered[None].astype(np.float32), np.pad(self.positions, ((0, pad), (0, 0)))[None],
                np.pad(self.frames, (0, pad))[None], np.pad(self.windows, (0, pad))[None], self.restore)


def _window_units(grid_h: int, grid_w: int, window: int) -> List[np.ndarray]:
    """The merged blocks of one frame (row-major ids over grid_h x grid_w blocks) grouped by window, windows row by
    row; without windows (window 0), one group of all of them."""
    ids = np.arange(grid_h * grid_w).reshape(grid_h, grid_w)
    if not window:
        return [ids.reshape(-1)]
    return [ids[top:top + window, left:left + window].reshape(-1)
            for top in range(0, grid_h, window) for left in range(0, grid_w, window)]


def vision_layout(grids: Sequence[Sequence[int]], merge: int = 2, window: int = 0,
                  window_rows: bool = False) -> VisionLayout:
    """The layout of images and clips of patch grids `grids` ((t, h, w) each, h and w multiples of `merge`),
    packed in order; `window`: the windowed layers' side in merged blocks (window_size / merge / patch_size;
    0: no windows); `window_rows`: each window padded to a full row (see the module docstring)."""
    unit = merge * merge
    window_rows = bool(window_rows and window)
    order, positions, frames, windows, restore, tokens = [], [], [], [], [], []
    patch_offset = frame_id = window_id = slots = 0
    for number, grid in enumerate(grids):
        grid_t, grid_h, grid_w = (int(v) for v in grid)
        if grid_h % merge or grid_w % merge or min(grid_t, grid_h, grid_w) < 1:
            raise InputError(f"image {number}: a patch grid of {grid_t}x{grid_h}x{grid_w}; its height and width must "
                             f"be positive multiples of the merge size {merge}")
        blocks_h, blocks_w = grid_h // merge, grid_w // merge
        # each merged block's patches' (h, w), in the processor's order (block by block, row-major inside)
        rows = np.arange(grid_h).reshape(blocks_h, merge, 1, 1).repeat(blocks_w, 2).repeat(merge, 3)
        cols = np.arange(grid_w).reshape(1, 1, blocks_w, merge).repeat(blocks_h, 0).repeat(merge, 1)
        block_rows = rows.transpose(0, 2, 1, 3).reshape(blocks_h * blocks_w, unit)
        block_cols = cols.transpose(0, 2, 1, 3).reshape(blocks_h * blocks_w, unit)
        item_restore = np.empty(grid_t * blocks_h * blocks_w, np.int64)
        for t in range(grid_t):
            frame_id += 1
            for group in _window_units(blocks_h, blocks_w, window):
                window_id += 1
                for block in group:
                    first = patch_offset + (t * blocks_h * blocks_w + block) * unit
                    order.extend(range(first, first + unit))
                    positions.extend(zip(block_rows[block], block_cols[block]))
                    item_restore[t * blocks_h * blocks_w + block] = slots
                    slots += 1
                frames.extend([frame_id] * unit * len(group))
                windows.extend([window_id] * unit * len(group))
                empty = window * window - len(group) if window_rows else 0
                order.extend([-1] * unit * empty)
                positions.extend([(0, 0)] * unit * empty)
                frames.extend([0] * unit * empty)
                windows.extend([0] * unit * empty)
                slots += empty
        restore.extend(item_restore.tolist())
        tokens.append(grid_t * blocks_h * blocks_w)
        patch_offset += grid_t * grid_h * grid_w
    return VisionLayout(np.asarray(order, np.int64), np.asarray(positions, np.int32).reshape(-1, 2),
                        np.asarray(frames, np.int32), np.asarray(windows, np.int32), np.asarray(restore, np.int32),
                        tokens, window * window * unit if window_rows else 0)


def mrope_positions(ids: Sequence[int], grids: Sequence[Sequence[int]], vision_tokens: Sequence[int],
                    merge: int = 2, time_steps: Sequence[float] = ()) -> Tuple[np.ndarray, int]:
    """M-RoPE's positions of a prompt: (3, len(ids)) int32 (time, height, width) and the delta its generated
    tokens add to their index (position = index + delta on every axis).

    A text token's three positions are equal and count on from the largest position before it. Each run of a
    vision token (`vision_tokens`: the image and video pad ids) is the next of `grids`, (t, h, w) in patches,
    merged to (t, h / merge, w / merge) tokens placed at (time, row, column) from the run's start; time steps by
    `time_steps[i]` per temporal patch (Qwen2.5-VL: seconds per temporal patch x tokens per second; Qwen2-VL and
    images: 1)."""
    ids = np.asarray(ids)
    is_vision = np.isin(ids, list(vision_tokens))
    positions = np.zeros((3, len(ids)), np.int64)
    start, index, item = 0, 0, 0
    while index < len(ids):
        if not is_vision[index]:
            positions[:, index] = start
            start, index = start + 1, index + 1
            continue
        if item >= len(grids):
            raise InputError(f"the prompt holds more vision token runs than the {len(grids)} images and videos given")
        grid_t, grid_h, grid_w = (int(v) for v in grids[item])
        rows, cols = grid_h // merge, grid_w // merge
        count = grid_t * rows * cols
        if not np.all(ids[index:index + count] == ids[index]) or index + count > len(ids):
            raise InputError(f"image or video {item}: its grid {grid_t}x{grid_h}x{grid_w} makes {count} tokens, but "
                             f"the prompt's run of its token is shorter; render the prompt for these grids")
        step = time_steps[item] if item < len(time_steps) else 1.0
        times = (np.arange(grid_t) * step).astype(np.int64)  # truncated, as transformers' .long()
        positions[0, index:index + count] = start + np.repeat(times, rows * cols)
        positions[1, index:index + count] = start + np.tile(np.repeat(np.arange(rows), cols), grid_t)
        positions[2, index:index + count] = start + np.tile(np.arange(cols), grid_t * rows)
        start = int(positions[:, index:index + count].max()) + 1
        index, item = index + count, item + 1
    if item != len(grids):
        raise InputError(f"{len(grids)} images and videos given, but the prompt has vision token runs for {item}")
    return positions.astype(np.int32), int(start - len(ids))


def packed_inputs(attachments: Sequence[tuple], merge: int, window: int, window_rows: bool, size: int,
                  capacity: int, patch_values: int) -> tuple:
    """The tower's inputs (VisionLayout.graph_inputs) for `attachments` ((kind, patches, grid, time step) each, in
    the order their tokens are read) packed in `size` patches, their merged tokens' order (restore) padded to
    `capacity`, which the slots take as "not a slot"; empty patches, which no slot reads, when there is none."""
    if attachments:
        layout = vision_layout([grid for _, _, grid, _ in attachments], merge, window, window_rows)
        *inputs, restore = layout.graph_inputs(np.concatenate([patches for _, patches, _, _ in attachments]), size)
    else:
        inputs = [np.zeros((1, size, patch_values), np.float32), np.zeros((1, size, 2), np.int32),
                  np.zeros((1, size), np.int32), np.zeros((1, size), np.int32)]
        restore = np.zeros(0, np.int32)
    return (*inputs, np.pad(restore.astype(np.int32), (0, capacity - len(restore))))  # the padding: never read


def laid_out_patches(grids: Sequence[Sequence[int]], merge: int, window: int, window_rows: bool) -> int:
    """The patches `grids` take packed (with windows as rows, each window padded to a full row)."""
    return vision_layout(grids, merge, window, window_rows).patches if len(grids) else 0


@dataclass
class PackedViTLayout:
    """Images for a ViT with a CLS token and a learned square position table (DINOv2, cells.vision.PackedViT)
    packed along one sequence: each image its CLS row, then its patches in the processor's merge-block order (a
    merge x merge block's patches consecutive, so the merged tokens are a reshape away)."""

    placement: np.ndarray  # (rows, 2 + table^2) float32: CLS position | grid weights | CLS token
    segments: np.ndarray  # (rows,) int32: 1.. the image a row belongs to
    grids: List[Tuple[int, int]]  # (h, w) patches of each image
    merge: int

    @property
    def rows(self) -> int:
        return len(self.segments)

    def graph_inputs(self, patches: np.ndarray, bucket: int = 0):
        """PackedViT's inputs for `patches` (every image's patches in order, (patches, values)): patches, placement
        and segments with a batch axis of 1, padded to `bucket` rows (0: as many as there are) with rows of segment
        0, which no image attends to."""
        size = bucket or self.rows
        if size < self.rows:
            raise InputError(f"a vision bucket of {size} rows for {len(self.grids)} images that take {self.rows} (one "
                             f"CLS row each and their patches); use a larger bucket or fewer, smaller images")
        if len(patches) != self.rows - len(self.grids):
            raise InputError(f"{len(patches)} patches for images of {self.rows - len(self.grids)}")
        packed = np.zeros((size, patches.shape[1]), np.float32)
        packed[np.flatnonzero(self.placement[:, -1] == 0)] = patches
        placement = np.zeros((size, self.placement.shape[1]), np.float32)
        placement[:self.rows] = self.placement
        return packed[None], placement[None], np.pad(self.segments, (0, size - self.rows))[None]

    def image_states(self, states: np.ndarray, index: int) -> np.ndarray:
        """The output rows of image `index` as DINOv2 gives them: (1 + h * w, width), the CLS first, then the
        patches row by row."""
        start = sum(1 + h * w for h, w in self.grids[:index])
        grid_h, grid_w = self.grids[index]
        rows = states[start:start + 1 + grid_h * grid_w]
        return np.concatenate([rows[:1], rows[1:][_block_order(grid_h, grid_w, self.merge).argsort()]])


def _block_order(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """The row-major index of each patch of a grid_h x grid_w grid in merge-block order."""
    ids = np.arange(grid_h * grid_w).reshape(grid_h // merge, merge, grid_w // merge, merge)
    return ids.transpose(0, 2, 1, 3).reshape(-1)


def packed_vit_layout(grids: Sequence[Sequence[int]], table: int, merge: int = 2) -> PackedViTLayout:
    """The layout of images of patch grids `grids` ((h, w) each, multiples of `merge`) for a position table of
    table x table patches (DINOv2: 37)."""
    placements, segments = [], []
    for number, grid in enumerate(grids):
        grid_h, grid_w = (int(v) for v in grid)
        if grid_h % merge or grid_w % merge or min(grid_h, grid_w) < 1:
            raise InputError(f"image {number}: a patch grid of {grid_h}x{grid_w}; each side must be a positive "
                             f"multiple of the merge size {merge}")
        rows = np.zeros((1 + grid_h * grid_w, 2 + table * table), np.float32)
        rows[0, [0, -1]] = 1.0  # the CLS row: its position and its token
        rows[1:, 1:-1] = position_weights(table, grid_h, grid_w)[_block_order(grid_h, grid_w, merge)]
        placements.append(rows)
        segments.extend([number + 1] * len(rows))
    return PackedViTLayout(np.concatenate(placements), np.asarray(segments, np.int32),
                           [(int(h), int(w)) for h, w in grids], merge)


@dataclass(frozen=True)
class WindowedPacking:
    """A Qwen2-VL / Qwen2.5-VL tower's packed inputs (cells.native_vision.NativeVisionTower): window order, 2D
    positions, frame and window segments, and the merged tokens' restore order."""

    merge: int = 2
    window: int = 0
    window_rows: bool = False
    patch_values: int = 1176
    names = ("patches", "vision_positions", "frames", "windows", "restore")

    def laid_out(self, grids: Sequence[Sequence[int]]) -> int:
        """The patches `grids` ((t, h, w) each) take packed."""
        return laid_out_patches(grids, self.merge, self.window, self.window_rows)

    def inputs(self, attachments: Sequence[tuple], size: int, capacity: int) -> tuple:
        """The tower's inputs (packed_inputs) in `size` patches, `capacity` merged tokens."""
        return packed_inputs(attachments, self.merge, self.window, self.window_rows, size, capacity,
                             self.patch_values)

    def specs(self, size: int, capacity: int) -> List[Tuple[str, str, tuple]]:
        """(name, dtype, shape) of each input, in `names`' order, at `size` patches and `capacity` merged tokens."""
        return [("patches", "float32", (1, size, self.patch_values)), ("vision_positions", "int32", (1, size, 2)),
                ("frames", "int32", (1, size)), ("windows", "int32", (1, size)), ("restore", "int32", (capacity,))]

    def manifest(self) -> dict:
        """What a package records of it (package_packing reads it back)."""
        return {"packing": "windowed", "merge": self.merge, "window": self.window, "window_rows": self.window_rows,
                "patch_values": self.patch_values}


@dataclass(frozen=True)
class ViTPacking:
    """A ViT with a CLS token and a learned table of table x table positions (DINOv2; cells.native_vision.ViTTower)
    over packed images: PackedViTLayout's patches, placement and segments, and `keep`, the rows of every image's
    patches in merge-block order (each merged token's merge^2 patches consecutive), padded to the capacity with row
    0 (tokens past the batch's are never a slot). Images only: a ViT has no time axis (a video is refused)."""

    table: int = 37
    merge: int = 2
    patch_values: int = 588
    names = ("patches", "placement", "segments", "keep")

    def laid_out(self, grids: Sequence[Sequence[int]]) -> int:
        """The rows `grids` ((1, h, w) each) take packed: a CLS row and h x w patches each."""
        return sum(1 + int(h) * int(w) for _, h, w in self._images(grids))

    def inputs(self, attachments: Sequence[tuple], size: int, capacity: int) -> tuple:
        unit = self.merge * self.merge
        if attachments:
            layout = packed_vit_layout([(h, w) for _, h, w in self._images([a[2] for a in attachments])], self.table,
                                       self.merge)
            packed = layout.graph_inputs(np.concatenate([patches for _, patches, _, _ in attachments]), size)
            keep = np.flatnonzero(layout.placement[:, -1] == 0).astype(np.int32)
        else:
            packed = (np.zeros((1, size, self.patch_values), np.float32),
                      np.zeros((1, size, 2 + self.table * self.table), np.float32), np.zeros((1, size), np.int32))
            keep = np.zeros(0, np.int32)
        return (*packed, np.pad(keep, (0, capacity * unit - len(keep))))

    def specs(self, size: int, capacity: int) -> List[Tuple[str, str, tuple]]:
        return [("patches", "float32", (1, size, self.patch_values)),
                ("placement", "float32", (1, size, 2 + self.table * self.table)), ("segments", "int32", (1, size)),
                ("keep", "int32", (capacity * self.merge * self.merge,))]

    def manifest(self) -> dict:
        return {"packing": "vit", "table": self.table, "merge": self.merge, "patch_values": self.patch_values}

    @staticmethod
    def _images(grids: Sequence[Sequence[int]]) -> List[Tuple[int, int, int]]:
        found = [tuple(int(v) for v in grid) for grid in grids]
        for number, (frames, _, _) in enumerate(found):
            if frames != 1:
                raise InputError(f"attachment {number}: a video ({frames} temporal patches); this model's vision "
                                 f"encoder reads images only: send its frames as images")
        return found


def tower_packing(native) -> Union[WindowedPacking, ViTPacking]:
    """How a recipe's native tower (config.NativeConfig, model.native) takes packed images: ViTPacking for a dinov2
    tower, else WindowedPacking with the family's windows and merge."""
    if native.vit:
        return ViTPacking(native.table, native.merge, native.patch_values)
    return WindowedPacking(native.merge, native.window, native.window > 0, native.patch_values)


def package_packing(native: dict) -> Union[WindowedPacking, ViTPacking]:
    """The packing a native package's manifest records (its generation.native section; packages of the Qwen family
    written before ViT towers record no "packing")."""
    if native.get("packing") == "vit":
        return ViTPacking(native["table"], native["merge"], native["patch_values"])
    return WindowedPacking(native["merge"], native["window"], native["window_rows"], native["patch_values"])
