"""Online packing of every Transformer input of a batch into fixed-shape rows with segment ids.

Padding a batch to its longest possible sample wastes about half of the work on easy-VQA. Three streams
are packed, each into rows of its own length, several samples per row, with a segment id per sample, so
that attention is block-diagonal (cells/masks.py) and each sample computes exactly what it computes alone:

  text    every question's and every caption's valid tokens ([CLS] ... [SEP]) in `text_length`-token
          rows, positions restarting at 0 per sequence (TextPacker);
  audio   every clip's valid mel frames in `audio_frames`-frame rows, at even offsets with at least one
          zero frame after each clip, so that the stride-2 conv front-end sees around a clip exactly the
          zeros it sees around it alone, token positions restarting per clip (AudioPacker);
  fusion  every sample's used slots of its fusion token table [CLS | image | text | audio | answer] in
          `length`-token rows (FusionPacker).
The vision encoder needs no packing: every image has the same number of patches.

Shapes stay static: a stream's row count is the smallest entry of its bucket list that holds the batch
(`pack_rows`), else the stream falls back to the padded layout, so graph mode compiles once per
combination of buckets actually met (`Packer.shapes`), never per batch. The loader sizes the buckets
from the data (`SampleSizes`, `calibrate_rows`): it draws batches from the split's own lengths and
packs them, so the first bucket holds nearly every batch with little room to spare, on easy-VQA as on
a user's folder whose captions or clips are much longer. With packing disabled every
stream takes the padded layout (one sample per row, every slot present, unused ones masked), so the same
graph code serves both and the benchmark compares them on equal terms.

Arrays handed to the model, in PACK_COLUMNS order (B samples; Lt = max_text_length; Na = max_audio_frames
/ 2 tokens per clip; La answer slots; P fusion table slots per sample):
  text_pack_ids (Rt, Lx) int32        token ids of the text rows (0 at padding)
  text_pack_positions (Rt, Lx) int32  position of each token within its sequence (0 at padding)
  text_pack_segment (Rt, Lx) int32    1, 2, ... per sequence within a row; 0 at padding
  text_index (2B, Lt) int32           flattened row position (r * Lx + s) of token j of question b (row b)
                                      and of caption b (row B + b); Rt * Lx (the zero row) past the end
  audio_pack_mel (Ra, n_mels, Tx) f32 the clips' mel frames, zero between and after clips
  audio_pack_segment (Ra, Tx) int32   1, 2, ... per clip at its frames; 0 in gaps and padding; token i of
                                      a row (centred on frame 2i) belongs to segment [r, 2i]
  audio_pack_positions (Ra, Tx/2) i32 position of each token within its clip (0 at padding)
  audio_index (B, Na) int32           flattened token position (r * Tx/2 + i) of token j of clip b;
                                      Ra * Tx / 2 (the zero row) past the clip's end
  pack_index (Rf, S) int32            fusion slot b * P + p gathered into each row position (0 at padding)
  pack_segment (Rf, S) int32          1, 2, ... per sample within a row; 0 at padding
  pack_answer (Rf, S) float32         1 at answer slots (causal among themselves), 0 elsewhere
  cls_index (B,) int32                r * S + s of each sample's fusion CLS in the flattened rows
  answer_index (B, La) int32          flattened row positions of each sample's answer slots
"The zero row" is a row of zeros the encoders append after their flattened rows (cells/packed.py), so
a slot a sample does not have reads zeros; the fusion never reads those slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindvl.config import Config
from mindvl.errors import ConfigError

# What the packer reads, in the order _PackStage hands the loader's columns to it.
PACK_INPUTS = ("question_ids", "question_mask", "caption_ids", "caption_mask", "audio_mel", "audio_mask",
               "use_text", "use_audio")
TEXT_COLUMNS = ("text_pack_ids", "text_pack_positions", "text_pack_segment", "text_index")
AUDIO_COLUMNS = ("audio_pack_mel", "audio_pack_segment", "audio_pack_positions", "audio_index")
FUSION_COLUMNS = ("pack_index", "pack_segment", "pack_answer", "cls_index", "answer_index")
PACK_COLUMNS = TEXT_COLUMNS + AUDIO_COLUMNS + FUSION_COLUMNS

# Without the data's lengths (a packer built outside the loader), buckets come from the average share of
# the padded layout a sample uses, measured on easy-VQA: a fusion sequence about half its table, a
# question + caption pair about half of 2 * max_text_length, a clip about 60% of its frames.
FUSION_USE, TEXT_USE, AUDIO_USE = 0.5, 0.5, 0.6
BUCKET_FILLS = (0.85, 0.7)  # those buckets hold a batch of average samples at these fill ratios
# From the data's lengths: the first bucket holds this share of drawn batches, the second the largest
# drawn batch with BUCKET_HEADROOM to spare (a batch beyond both takes the padded layout).
CALIBRATION_BATCHES, BUCKET_COVERAGE, BUCKET_HEADROOM = 256, 0.99, 0.1


@dataclass(frozen=True)
class FusionLayout:
    """Slot counts of one sample's fusion token table, in the order the fusion concatenates them."""

    image_tokens: int  # vision tokens, its CLS included
    text_tokens: int  # preprocess.max_text_length
    audio_tokens: int  # max_audio_frames / 2 (the audio encoder halves time)
    answer_tokens: int  # max_answer_length - 1 (teacher-forced inputs)

    @classmethod
    def from_config(cls, cfg: Config) -> "FusionLayout":
        pre = cfg.preprocess
        patches = (pre.image_size // cfg.model.vision.patch_size) ** 2
        return cls(patches + 1, pre.max_text_length, pre.max_audio_frames // 2, pre.max_answer_length - 1)

    @property
    def text_offset(self) -> int:
        return 1 + self.image_tokens

    @property
    def audio_offset(self) -> int:
        return self.text_offset + self.text_tokens

    @property
    def answer_offset(self) -> int:
        return self.audio_offset + self.audio_tokens

    @property
    def length(self) -> int:
        return self.answer_offset + self.answer_tokens

    def size(self, question_tokens: np.ndarray, clip_frames: np.ndarray, use_text: np.ndarray,
             use_audio: np.ndarray) -> np.ndarray:
        """Used slots per sample (the count `used_slots` lists), from lengths instead of masks."""
        audio = np.minimum((clip_frames + 1) // 2, self.audio_tokens)
        return (self.text_offset + (use_text > 0) * np.minimum(question_tokens, self.text_tokens)
                + (use_audio > 0) * audio + self.answer_tokens).astype(np.int64)

    def used_slots(self, question_mask: np.ndarray, audio_mask: np.ndarray, use_text: float,
                   use_audio: float) -> Tuple[np.ndarray, np.ndarray]:
        """(prefix slots, answer slots) of one sample: CLS, image, valid question tokens if the text is
        used, valid audio tokens if the audio is used; then every answer slot. An audio token is valid
        when the frame it is centred on is (the encoder's stride-2 rule, cells/audio.py)."""
        parts = [np.arange(self.text_offset)]  # the fusion CLS and the image tokens
        if use_text > 0:
            parts.append(self.text_offset + np.flatnonzero(question_mask[:self.text_tokens] > 0))
        if use_audio > 0:
            parts.append(self.audio_offset + np.flatnonzero(audio_mask[::2][:self.audio_tokens] > 0))
        prefix = np.concatenate(parts).astype(np.int32)
        answer = (self.answer_offset + np.arange(self.answer_tokens)).astype(np.int32)
        return prefix, answer


@dataclass
class PackedStream:
    """One stream's arrays (in its *_COLUMNS order) and how well its rows are used."""

    arrays: Tuple[np.ndarray, ...]
    rows_used: int  # rows holding at least one sample
    useful_tokens: int  # row slots that hold a sample's token (audio: tokens, not frames)
    capacity: int  # row slots in all

    @property
    def fill(self) -> float:
        return self.useful_tokens / max(self.capacity, 1)

    @property
    def shape(self) -> Tuple[int, int]:
        """(rows, row length) of the stream's first array: what a graph compiles for."""
        first = self.arrays[0]
        return (first.shape[0], first.shape[-1])


@dataclass
class PackedBatch:
    text: PackedStream
    audio: PackedStream
    fusion: PackedStream

    @property
    def arrays(self) -> Tuple[np.ndarray, ...]:
        """Every column, in PACK_COLUMNS order."""
        return self.text.arrays + self.audio.arrays + self.fusion.arrays

    @property
    def shapes(self) -> Tuple[Tuple[int, int], ...]:
        """(text, audio, fusion) (rows, row length): one graph compilation per distinct value."""
        return (self.text.shape, self.audio.shape, self.fusion.shape)


class _Buckets:
    """A stream's row-count buckets, those below `fallback` (the padded layout's row count) kept;
    `pick(needed)` -> the smallest that holds `needed` rows, or None: take the padded layout."""

    def __init__(self, rows: Sequence[int], fallback: int) -> None:
        self.rows = sorted({int(r) for r in rows if r < fallback})

    def pick(self, needed: int) -> Optional[int]:
        return next((r for r in self.rows if r >= needed), None)


def default_row_buckets(average: float, count: int, length: int) -> List[int]:
    """Row buckets when neither the recipe nor the data sizes them: enough `length`-slot rows for `count`
    items of `average` slots at each of BUCKET_FILLS; a batch that needs more falls back to the padded
    layout."""
    need = count * average / length
    return sorted({max(1, int(np.ceil(need / fill))) for fill in BUCKET_FILLS})


def calibrate_rows(needed: Sequence[int]) -> List[int]:
    """Row buckets from the rows that drawn batches needed: the BUCKET_COVERAGE quantile, and the largest
    with BUCKET_HEADROOM to spare."""
    needed = np.asarray(needed)
    first = int(np.quantile(needed, BUCKET_COVERAGE, method="higher"))
    return sorted({first, int(np.ceil(needed.max() * (1 + BUCKET_HEADROOM)))})


@dataclass(frozen=True)
class SampleSizes:
    """What each example of a split puts into the packed streams (mindvl.data.reading.loader.sample_sizes):
    token counts of its question and caption, the mel frame counts of its question's clips (the loader
    speaks one of them) and the question modality mix over (text, audio, both)."""

    question_tokens: np.ndarray  # (N,) int
    caption_tokens: np.ndarray  # (N,) int
    clip_frames: Sequence[np.ndarray]  # N arrays of frame counts
    modality_mix: Sequence[float]

    def draw(self, batch: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        """One batch of random examples: question and caption tokens, a clip's frames, modality flags."""
        picks = rng.choice(len(self.question_tokens), size=batch, replace=False)
        frames = np.array([rng.choice(self.clip_frames[n]) for n in picks])
        modality = rng.choice(3, size=batch, p=np.asarray(self.modality_mix) / np.sum(self.modality_mix))
        return {"question": self.question_tokens[picks], "caption": self.caption_tokens[picks],
                "frames": frames, "use_text": (modality != 1).astype(np.float32),
                "use_audio": (modality != 0).astype(np.float32)}


def pack_rows(sizes: Sequence[int], capacity: int, gaps: Optional[Sequence[int]] = None) -> List[List[int]]:
    """Bin packing of items (by index) into rows of `capacity`, a row at a time: the longest item left,
    plus the subset of the others that fills the row most (subset sums over the row's slots; on a tie
    the subset met first, longer items first). On easy-VQA's clips, which are large next to a row, it
    needs about 9% fewer rows than first-fit decreasing; on questions and fusion sequences a little fewer.

    gaps[i] (0 or 1): room item i leaves empty after itself when another item follows it in its row.
    A row lists its items gap-free first, then by index, so a gap after the row's last item falls past
    its end and costs nothing.
    """
    gaps = list(gaps) if gaps is not None else [0] * len(sizes)
    left = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    rows: List[List[int]] = []
    while left:
        first = left[0]
        # (slots counted with every gap, whether a gapped item is in) -> the items reaching that state
        reach = {(sizes[first] + gaps[first], gaps[first] > 0): [first]}
        for item in left[1:]:
            for (total, gapped), items in list(reach.items()):
                state = (total + sizes[item] + gaps[item], gapped or gaps[item] > 0)
                if state[0] <= capacity + state[1] and state not in reach:
                    reach[state] = items + [item]
        best = reach[max(reach, key=lambda state: state[0] - state[1])]  # the first state with most slots used
        rows.append(sorted(best, key=lambda i: (gaps[i] > 0, i)))
        chosen = set(best)
        left = [i for i in left if i not in chosen]
    return rows


def _prefix_lengths(mask: np.ndarray, what: str) -> np.ndarray:
    """(N, L) float {1, 0} masks whose ones come first -> (N,) int lengths; anything else is a bug upstream
    (the packer copies a sample's first `length` entries)."""
    lengths = (mask > 0).sum(axis=1)
    if np.any((mask > 0) != (np.arange(mask.shape[1])[None] < lengths[:, None])):
        raise ValueError(f"{what}: expected masks whose valid entries come first (as preprocess pads them)")
    return lengths


# ----------------------------------------------------------------------------- text

class TextPacker:
    """Packs `sequences` token sequences (questions then captions) of at most `max_length` tokens."""

    def __init__(self, max_length: int, sequences: int, enabled: bool = True, length: int = 32,
                 rows: Sequence[int] = ()) -> None:
        if enabled and length < max_length:
            raise ConfigError(f"data.packing.text_length: {length} is shorter than the longest text "
                              f"(preprocess.max_text_length={max_length}); raise it to at least {max_length}")
        self.max_length = int(max_length)
        self.sequences = int(sequences)
        self.enabled = bool(enabled)
        self.length = int(length)
        self.buckets = _Buckets(rows or default_row_buckets(TEXT_USE * max_length, sequences, length), sequences)

    def shapes(self) -> List[Tuple[int, int]]:
        """Every (rows, row length) a batch can take."""
        packed = [(r, self.length) for r in self.buckets.rows] if self.enabled else []
        return packed + [(self.sequences, self.max_length)]

    def bins(self, lengths: np.ndarray) -> List[List[int]]:
        """Sequences (by index) per row, from their token counts."""
        return pack_rows(lengths.tolist(), self.length)

    def arrange(self, lengths: np.ndarray) -> Tuple[List[List[int]], int, int]:
        """(sequences per row, rows, row length) of a batch with these token counts: packed into the smallest row
        bucket that holds them, else the padded layout (sequence n alone in row n)."""
        bins = self.bins(lengths) if self.enabled else None
        rows = self.buckets.pick(len(bins)) if bins is not None else None
        if rows is None:
            return [[n] for n in range(len(lengths))], len(lengths), self.max_length
        return bins, rows, self.length

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> PackedStream:
        """ids (N, Lt) int32, mask (N, Lt) float32 -> PackedStream with TEXT_COLUMNS."""
        lengths = _prefix_lengths(mask, "text masks")
        bins, rows, length = self.arrange(lengths)
        out_ids = np.zeros((rows, length), np.int32)
        positions = np.zeros((rows, length), np.int32)
        segment = np.zeros((rows, length), np.int32)
        index = np.full(ids.shape, rows * length, np.int32)  # the zero row past the end
        for r, members in enumerate(bins):
            cursor = 0
            for seg, n in enumerate(members, start=1):
                count = int(lengths[n])
                out_ids[r, cursor:cursor + count] = ids[n, :count]
                positions[r, cursor:cursor + count] = np.arange(count)
                segment[r, cursor:cursor + count] = seg
                index[n, :count] = r * length + cursor + np.arange(count)
                cursor += count
        return PackedStream((out_ids, positions, segment, index), len(bins), int(lengths.sum()), rows * length)


# ----------------------------------------------------------------------------- audio

class AudioPacker:
    """Packs each of `batch` clips of at most `max_frames` mel frames into rows of `frames` frames.

    A clip of f frames at frame offset o (even) owns tokens o/2 .. o/2 + ceil(f/2) - 1 of the encoder's
    stride-2 output; the next clip starts at the first even frame after o + f, so at least one zero frame
    follows every clip (the token after an even-length clip stays empty). cells/audio.py relies on it.
    """

    def __init__(self, max_frames: int, batch: int, enabled: bool = True, frames: int = 256,
                 rows: Sequence[int] = ()) -> None:
        if enabled and (frames < max_frames or frames % 2):
            raise ConfigError(f"data.packing.audio_frames: expected an even number of frames of at least "
                              f"preprocess.max_audio_frames={max_frames}, got {frames}")
        self.max_frames = int(max_frames)
        self.batch = int(batch)
        self.enabled = bool(enabled)
        self.frames = int(frames)
        average = AUDIO_USE * max_frames / 2 + 0.5  # tokens, half the clips leaving an empty token after them
        self.buckets = _Buckets(rows or default_row_buckets(average, batch, frames // 2), batch)

    def shapes(self) -> List[Tuple[int, int]]:
        packed = [(r, self.frames) for r in self.buckets.rows] if self.enabled else []
        return packed + [(self.batch, self.max_frames)]

    def bins(self, frames: np.ndarray) -> List[List[int]]:
        """Clips (by index) per row, from their frame counts: ceil(f / 2) tokens, an even-length clip
        leaving one empty token after it."""
        return pack_rows(((frames + 1) // 2).tolist(), self.frames // 2, (1 - frames % 2).tolist())

    def arrange(self, frames: np.ndarray) -> Tuple[List[List[int]], int, int]:
        """(clips per row, rows, row length in frames) of a batch with these frame counts: packed into the smallest
        row bucket that holds them, else the padded layout (clip b alone in row b)."""
        bins = self.bins(frames) if self.enabled else None
        rows = self.buckets.pick(len(bins)) if bins is not None else None
        if rows is None:
            return [[b] for b in range(len(frames))], len(frames), self.max_frames
        return bins, rows, self.frames

    def __call__(self, mel: np.ndarray, mask: np.ndarray) -> PackedStream:
        """mel (B, n_mels, T) float32, frame mask (B, T) float32 -> PackedStream with AUDIO_COLUMNS."""
        frames = _prefix_lengths(mask, "audio frame masks")
        tokens = (frames + 1) // 2  # token i is centred on frame 2i
        bins, rows, length = self.arrange(frames)
        token_length = length // 2
        out_mel = np.zeros((rows, mel.shape[1], length), np.float32)
        segment = np.zeros((rows, length), np.int32)
        positions = np.zeros((rows, token_length), np.int32)
        index = np.full((len(frames), self.max_frames // 2), rows * token_length, np.int32)
        for r, members in enumerate(bins):
            cursor = 0  # in tokens; the clip starts at frame 2 * cursor
            # in pack_rows' order: a clip with a trailing gap comes last, so the gap may pass the row's end
            for seg, b in enumerate(members, start=1):
                f, n = int(frames[b]), int(tokens[b])
                out_mel[r, :, 2 * cursor:2 * cursor + f] = mel[b, :, :f]
                segment[r, 2 * cursor:2 * cursor + f] = seg
                positions[r, cursor:cursor + n] = np.arange(n)
                index[b, :n] = r * token_length + cursor + np.arange(n)
                cursor += n + 1 - f % 2  # past the zero frame(s) to the next even frame
        return PackedStream((out_mel, segment, positions, index), len(bins), int(tokens.sum()), rows * token_length)


# ----------------------------------------------------------------------------- fusion

class FusionPacker:
    """Lays out a batch's used fusion slots in rows; see the module docstring."""

    def __init__(self, layout: FusionLayout, batch_size: int, enabled: bool = True, length: int = 128,
                 rows: Sequence[int] = ()) -> None:
        self.layout = layout
        self.batch_size = int(batch_size)
        self.enabled = bool(enabled)
        if self.enabled and length < layout.length:
            raise ConfigError(
                f"data.packing.length: {length} is shorter than the longest possible sample ({layout.length} "
                f"tokens: 1 CLS + {layout.image_tokens} image + {layout.text_tokens} text + "
                f"{layout.audio_tokens} audio + {layout.answer_tokens} answer); raise it to at least "
                f"{layout.length}")
        self.length = int(length) if self.enabled else layout.length
        buckets = rows or default_row_buckets(FUSION_USE * layout.length, self.batch_size, self.length)
        self.rows = _Buckets(buckets, self.batch_size).rows + [self.batch_size] if self.enabled else [self.batch_size]

    def shapes(self) -> List[Tuple[int, int]]:
        """Every (rows, length) a batch can take: one graph compilation each."""
        return [(rows, self.length) for rows in self.rows]

    def bins(self, sizes: Sequence[int]) -> List[List[int]]:
        """Samples (by index) per row, from their used slot counts."""
        return pack_rows(list(sizes), self.length)

    def arrange(self, sizes: Sequence[int]) -> Tuple[List[List[int]], int]:
        """(samples per row, rows) of a packed batch with these used slot counts: the smallest row bucket that
        holds them (more rows than the batch size can only mean one sample per row)."""
        bins = self.bins(sizes)
        rows = next((r for r in self.rows if r >= len(bins)), None)
        if rows is None:
            return [[b] for b in range(len(sizes))], len(sizes)
        return bins, rows

    def __call__(self, question_mask: np.ndarray, audio_mask: np.ndarray, use_text: np.ndarray,
                 use_audio: np.ndarray) -> PackedStream:
        batch = question_mask.shape[0]
        slots = [self.layout.used_slots(question_mask[b], audio_mask[b], use_text[b], use_audio[b])
                 for b in range(batch)]
        if not self.enabled:
            return self._padded(slots)
        bins, rows = self.arrange([len(prefix) + len(answer) for prefix, answer in slots])
        return self._place(slots, bins, rows)

    def _padded(self, slots) -> PackedStream:
        """One sample per row over every slot (unused ones masked): the classic padded layout."""
        batch, length = len(slots), self.layout.length
        index = np.arange(batch * length, dtype=np.int32).reshape(batch, length)
        segment = np.zeros((batch, length), np.int32)
        answer_flag = np.zeros((batch, length), np.float32)
        answer_index = np.zeros((batch, self.layout.answer_tokens), np.int32)
        for b, (prefix, answer) in enumerate(slots):
            segment[b, prefix] = 1
            segment[b, answer] = 1
            answer_flag[b, answer] = 1.0
            answer_index[b] = b * length + answer
        cls_index = np.arange(batch, dtype=np.int32) * length
        useful = int(segment.astype(bool).sum())
        return PackedStream((index, segment, answer_flag, cls_index, answer_index), batch, useful, index.size)

    def _place(self, slots, bins: List[List[int]], rows: int) -> PackedStream:
        length, table = self.length, self.layout.length
        index = np.zeros((rows, length), np.int32)
        segment = np.zeros((rows, length), np.int32)
        answer_flag = np.zeros((rows, length), np.float32)
        cls_index = np.zeros(len(slots), np.int32)
        answer_index = np.zeros((len(slots), self.layout.answer_tokens), np.int32)
        useful = 0
        for r, members in enumerate(bins):
            cursor = 0
            for seg, b in enumerate(members, start=1):
                prefix, answer = slots[b]
                n_prefix, n = len(prefix), len(prefix) + len(answer)
                index[r, cursor:cursor + n] = b * table + np.concatenate((prefix, answer))
                segment[r, cursor:cursor + n] = seg
                answer_flag[r, cursor + n_prefix:cursor + n] = 1.0
                cls_index[b] = r * length + cursor  # prefix[0] is slot 0, the CLS
                answer_index[b] = r * length + cursor + n_prefix + np.arange(len(answer))
                cursor += n
            useful += cursor
        return PackedStream((index, segment, answer_flag, cls_index, answer_index), len(bins), useful, index.size)


# ----------------------------------------------------------------------------- the three together

class Packer:
    """A batch's columns (PACK_INPUTS) -> PackedBatch (PACK_COLUMNS); see the module docstring."""

    def __init__(self, text: TextPacker, audio: AudioPacker, fusion: FusionPacker) -> None:
        self.text, self.audio, self.fusion = text, audio, fusion

    @classmethod
    def from_config(cls, cfg: Config, batch_size: int = 0, sizes: Optional[SampleSizes] = None) -> "Packer":
        """The recipe's packer. Streams whose bucket list the recipe leaves empty are sized from `sizes`
        (the training split's lengths) when given, else from easy-VQA's averages."""
        packing, pre = cfg.data.packing, cfg.preprocess
        batch = batch_size or cfg.data.batch_size

        def build(text_rows: Sequence[int], audio_rows: Sequence[int], rows: Sequence[int]) -> "Packer":
            return cls(TextPacker(pre.max_text_length, 2 * batch, packing.enabled, packing.text_length, text_rows),
                       AudioPacker(pre.max_audio_frames, batch, packing.enabled, packing.audio_frames, audio_rows),
                       FusionPacker(FusionLayout.from_config(cfg), batch, packing.enabled, packing.length, rows))

        packer = build(packing.text_rows, packing.audio_rows, packing.rows)
        if sizes is None or not packing.enabled:
            return packer
        needed = packer.needed_rows(sizes, CALIBRATION_BATCHES, np.random.default_rng(cfg.data.seed))
        return build(packing.text_rows or calibrate_rows(needed["text"]),
                     packing.audio_rows or calibrate_rows(needed["audio"]),
                     packing.rows or calibrate_rows(needed["fusion"]))

    def describe(self, streams: Optional[Sequence[str]] = None) -> str:
        """The row buckets of each of `streams` (None: all), for the log (the last shape is the padded
        fallback)."""
        return "packing buckets (rows x length): " + "; ".join(
            f"{name} {', '.join(f'{r}x{n}' for r, n in shapes)}" for name, shapes in self.shapes().items()
            if streams is None or name in streams)

    def needed_rows(self, sizes: SampleSizes, batches: int, rng: np.random.Generator) -> Dict[str, List[int]]:
        """Rows each stream needs for `batches` batches drawn from `sizes`, as pack_rows packs them."""
        needed: Dict[str, List[int]] = {"text": [], "audio": [], "fusion": []}
        for _ in range(batches):
            drawn = sizes.draw(self.fusion.batch_size, rng)
            fusion = self.fusion.layout.size(drawn["question"], drawn["frames"], drawn["use_text"], drawn["use_audio"])
            needed["text"].append(len(self.text.bins(np.concatenate((drawn["question"], drawn["caption"])))))
            needed["audio"].append(len(self.audio.bins(drawn["frames"])))
            needed["fusion"].append(len(self.fusion.bins(fusion)))
        return needed

    def bucket_fill(self, sizes: SampleSizes, batches: int, rng: np.random.Generator) -> Dict[str, List[Dict]]:
        """Per stream, per shape of `shapes()`: how many of `batches` batches drawn from `sizes` take it and the
        share of its slots their tokens fill (None where no batch took it); the last shape of each stream is
        its padded fallback. Row counts as pack_rows packs them, token counts as __call__ counts them (audio:
        encoder tokens, ceil(frames / 2))."""
        taken = {name: {shape: [0, 0] for shape in shapes} for name, shapes in self.shapes().items()}

        def count(name: str, shape: Tuple[int, int], useful: int) -> None:
            taken[name][shape][0] += 1
            taken[name][shape][1] += useful

        for _ in range(batches):
            drawn = sizes.draw(self.fusion.batch_size, rng)
            texts = np.minimum(np.concatenate((drawn["question"], drawn["caption"])), self.text.max_length)
            count("text", self.text.arrange(texts)[1:], int(texts.sum()))
            frames = np.minimum(drawn["frames"], self.audio.max_frames)
            count("audio", self.audio.arrange(frames)[1:], int(((frames + 1) // 2).sum()))
            used = self.fusion.layout.size(drawn["question"], frames, drawn["use_text"], drawn["use_audio"])
            rows = self.fusion.arrange(used)[1] if self.fusion.enabled else self.fusion.batch_size
            count("fusion", (rows, self.fusion.length), int(used.sum()))
        step = {"text": 1, "audio": 2, "fusion": 1}  # slots per token along a row (audio rows count frames)
        return {name: [{"rows": r, "length": n, "padded": (r, n) == list(shapes)[-1], "batches": b,
                        "fill": round(u / (r * n // step[name] * b), 4) if b else None}
                       for (r, n), (b, u) in shapes.items()]
                for name, shapes in taken.items()}

    def shapes(self) -> Dict[str, List[Tuple[int, int]]]:
        """Every (rows, row length) each stream can take; a graph compiles once per combination met."""
        return {"text": self.text.shapes(), "audio": self.audio.shapes(), "fusion": self.fusion.shapes()}

    def __call__(self, question_ids: np.ndarray, question_mask: np.ndarray, caption_ids: np.ndarray,
                 caption_mask: np.ndarray, audio_mel: np.ndarray, audio_mask: np.ndarray, use_text: np.ndarray,
                 use_audio: np.ndarray) -> PackedBatch:
        """The loader's columns of one batch (shapes: mindvl.data.reading.loader.create_dataset)."""
        text = self.text(np.concatenate((question_ids, caption_ids)), np.concatenate((question_mask, caption_mask)))
        return PackedBatch(text, self.audio(audio_mel, audio_mask),
                           self.fusion(question_mask, audio_mask, use_text, use_audio))


class PackingStats:
    """Running packing statistics for the log: fill ratio, samples per used row, bucket use."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.samples = 0
        self.rows_used = 0
        self.useful = 0
        self.capacity = 0
        self.buckets: Dict[int, int] = {}

    def add(self, segment: np.ndarray, samples: int) -> None:
        """Count one batch from its pack_segment column (R, S) and its sample count."""
        used = segment > 0
        self.batches += 1
        self.samples += samples
        self.rows_used += int(used.any(axis=1).sum())
        self.useful += int(used.sum())
        self.capacity += used.size
        self.buckets[segment.shape[0]] = self.buckets.get(segment.shape[0], 0) + 1

    def summary(self) -> Dict[str, float]:
        return {"fill": round(self.useful / max(self.capacity, 1), 4),
                "samples_per_row": round(self.samples / max(self.rows_used, 1), 3),
                "useful_tokens_per_batch": round(self.useful / max(self.batches, 1), 1),
                "batches": self.batches, "row_buckets": dict(sorted(self.buckets.items()))}


# The packed streams of a training batch: (its segment column, sequences per sample, step from one token
# to the next along a row: audio segments are per mel frame and token i sits on frame 2i). The generative
# model's batches have one: its conversations (mindvl.data.reading.conversation_packing).
PACKED_STREAMS = {"text": ("text_pack_segment", 2, 1), "audio": ("audio_pack_segment", 1, 2),
                  "fusion": ("pack_segment", 1, 1), "conversation": ("segment", 1, 1)}


def stream_segments(columns: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Stream name -> its per-token segment ids (rows, tokens) from a batch's columns (numpy), for the
    streams the batch has (from cached encoder states, only the fusion)."""
    return {name: columns[column][:, ::step] for name, (column, _, step) in PACKED_STREAMS.items()
            if column in columns}


class PackingLog:
    """PackingStats for every packed stream of the training batches (text, audio, fusion)."""

    def __init__(self) -> None:
        self.streams = {name: PackingStats() for name in PACKED_STREAMS}

    def add(self, columns: Dict[str, np.ndarray], batch_size: int) -> None:
        """`columns`: at least the segment columns of one batch (numpy), by name."""
        for name, segment in stream_segments(columns).items():
            self.streams[name].add(segment, batch_size * PACKED_STREAMS[name][1])

    def reset(self) -> None:
        for stats in self.streams.values():
            stats.reset()

    def summary(self) -> Dict[str, Dict[str, float]]:
        return {name: stats.summary() for name, stats in self.streams.items() if stats.batches}

    def describe(self) -> str:
        parts = [f"{name} fill {s['fill']:.1%} ({s['samples_per_row']:.2f}/row, rows {s['row_buckets']})"
                 for name, s in self.summary().items()]
        return "packing: " + "; ".join(parts)
