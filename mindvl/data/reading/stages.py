"""The loader's per-modality batch transforms, each run by its own data.num_workers threads: images decoded
and augmented, spoken questions as padded log-mels, texts tokenised with the question modality drawn, and
the batch's texts, clips and fusion sequences packed. Picklable (they carry settings only) and loading
their tables once per process."""
import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from mindvl import preprocess as P
from mindvl.config import Config, PreprocessConfig
from mindvl.data.reading.order import AUDIO, CLIP, IMAGE, MODALITY, TEXT, generator, mix, uniform
from mindvl.data.reading.packing import FUSION_COLUMNS, PACK_COLUMNS, PACK_INPUTS, Packer
from mindvl.data.records import as_bytes
from mindvl.data.root import load_meta, load_tokenizer, require_file

MODALITIES = ("mix", "text", "audio", "both")
_FLAGS = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))  # (use_text, use_audio) for [text, audio, both]


class Tables:
    """Per-process caches: tokenised questions/captions/answers, the clip table, waveforms and mels."""

    def __init__(self, root: Path, pre: PreprocessConfig, split: str) -> None:
        from mindvl.data import records

        self.pid = os.getpid()
        self.pre = pre
        meta = load_meta(root)
        self.tokenizer = load_tokenizer(root)
        self.questions: List[str] = meta["questions"]
        self.captions: List[str] = meta["captions"]
        self.answers: List[str] = meta["answers"]
        self.clips: Dict[int, List[int]] = defaultdict(list)  # question_id -> clip indices
        self.pcm: List[bytes] = []
        self.names: List[str] = []
        rows = records.read_table(require_file(root, "speech.mindrecord"))
        rows.sort(key=lambda r: (r["question_id"], r["voice"], r["rate"]))  # independent of file order
        for row in rows:
            if row["split"] != split:
                continue
            self.clips[int(row["question_id"])].append(len(self.pcm))
            self.pcm.append(row["pcm"])
            self.names.append(f"clip of question {row['question_id']} ({row['voice']} at {row['rate']} wpm)")
        self._from_pcm16 = records.from_pcm16
        self._mels: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._questions: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._captions: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._answers: Dict[int, np.ndarray] = {}

    def question(self, qid: int) -> Tuple[np.ndarray, np.ndarray]:
        if qid not in self._questions:
            self._questions[qid] = self.tokenizer.encode(self.questions[qid], self.pre.max_text_length,
                                                         name=f"question {qid}")
        return self._questions[qid]

    def caption(self, cid: int) -> Tuple[np.ndarray, np.ndarray]:
        if cid not in self._captions:
            self._captions[cid] = self.tokenizer.encode(self.captions[cid], self.pre.max_text_length,
                                                        name=f"caption {cid}")
        return self._captions[cid]

    def answer_tokens(self, aid: int) -> np.ndarray:
        if aid not in self._answers:
            self._answers[aid] = self.tokenizer.encode_answer(self.answers[aid], self.pre.max_answer_length,
                                                              name=f"answer {aid}")
        return self._answers[aid]

    def clip_of(self, split: str, question_id: int) -> List[int]:
        clips = self.clips.get(question_id)
        if not clips:
            raise P.InputError(f"{split} question {question_id}: no spoken clip in speech.mindrecord; "
                               f"rebuild the data set with `mindvl data build --force`")
        return clips

    def waveform(self, clip: int) -> np.ndarray:
        return self._from_pcm16(self.pcm[clip])

    def mel(self, clip: int) -> Tuple[np.ndarray, np.ndarray]:
        """The clip's padded log-mel and frame mask, computed once per process."""
        if clip not in self._mels:
            name = self.names[clip]
            self._mels[clip] = P.speech_features(self.waveform(clip), self.pre, name=name)
        return self._mels[clip]


def voices_of(split: str) -> str:
    """Whose clips a split hears: validation questions are training questions, so the training voices."""
    return "test" if split == "test" else "train"


class Stage:
    """A picklable batch transform: carries settings only and loads `Tables` once per process."""

    def __init__(self, root: Union[str, Path], cfg: Config, split: str, epoch: int, tokens=None) -> None:
        self.root = str(root)
        self.tokens = tokens  # EncoderTokens: the stage hands on cached encoder states instead of inputs
        self.pre = cfg.preprocess
        self.augment = cfg.data.augment
        self.seed = int(cfg.data.seed)
        self.split = split
        self.train = split == "train"
        self.epoch = int(epoch)
        self._tables = None
        self._lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_tables"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def tables(self) -> Tables:
        tables = self._tables
        if tables is None or tables.pid != os.getpid():
            with self._lock:  # worker threads share one copy; load it once
                if self._tables is None or self._tables.pid != os.getpid():
                    self._tables = Tables(Path(self.root), self.pre, voices_of(self.split))
                tables = self._tables
        return tables

    @property
    def augmenting(self) -> bool:
        return self.train and self.augment.enabled

    def pixels(self, data: bytes, sample_id: int) -> np.ndarray:
        """An encoded image -> float32 (3, S, S), augmented in training (drawn from (seed, epoch, sample id));
        with cached states the vision encoder's (1 + N, width)."""
        from mindvl.data.reading.augment import augment_image

        name = f"{self.split} sample {sample_id} image"
        if self.tokens is not None:
            return self.tokens.image(data, name)
        if not self.augmenting:
            return P.decode_image(data, self.pre, name=name)
        img = augment_image(P.open_image(data, name=name), self.augment, self.pre.image_size,
                            generator(self.seed, self.epoch, sample_id, IMAGE))
        return P.image_to_array(img, self.pre)

    @property
    def perturbs_audio(self) -> bool:
        a = self.augment
        return self.augmenting and (a.speed != [1.0, 1.0] or a.pitch > 0 or a.noise > 0)

    def perturbed_mel(self, audio: np.ndarray, name: str, sample_id: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """Speed / pitch / noise on a waveform (drawn from (seed, epoch, sample id)) -> its padded log-mel and
        frame mask, or None when the perturbed clip no longer fits max_audio_frames: the caller keeps the
        unperturbed one (the build only admits clips that fit)."""
        from mindvl.data.reading.augment import augment_waveform

        audio = augment_waveform(audio, self.augment, self.pre.sample_rate,
                                 generator(self.seed, self.epoch, sample_id, AUDIO))
        try:
            return P.speech_features(audio, self.pre, name=name)
        except P.InputError:
            return None

    def spoken(self, tables: Tables, clip: int, sample_id: int) -> Tuple[np.ndarray, np.ndarray]:
        """A question clip's padded log-mel and frame mask, speed / pitch / noise perturbed in training when
        data.augment asks for it."""
        perturbed = self.perturbed_mel(tables.waveform(clip), tables.names[clip], sample_id) if self.perturbs_audio else None
        return perturbed or tables.mel(clip)

    def clip(self, tables: Tables, question_id: int, sample_id: int) -> int:
        """Which of the question's clips the sample hears: drawn per (seed, epoch, sample id) in training
        (voice augmentation), fixed by the sample id otherwise (test: only unseen voices)."""
        clips = tables.clip_of(self.split, question_id)
        if self.train:
            return clips[mix(self.seed, self.epoch, sample_id, CLIP) % len(clips)]
        return clips[sample_id % len(clips)]


class ImageStage(Stage):
    """Batch op: encoded images -> float32 (B, 3, S, S); random-resized-crop, flip, jitter in training.
    With cached states: (B, 1 + N, vision width)."""

    def __call__(self, images, sample_ids, batch_info=None):
        pixels = [self.pixels(as_bytes(data), int(sample_id)) for data, sample_id in zip(images, sample_ids)]
        return np.stack(pixels), np.asarray(sample_ids)


class AudioStage(Stage):
    """Map: question ids -> the padded log-mel of one spoken clip (B, n_mels, T) and frame mask (B, T).
    With cached states: the clip's states (B, T/2, audio width) instead of the mel."""

    def __call__(self, sample_ids, question_ids):
        tables = self.tables
        mels, masks = [], []
        for sample_id, question_id in zip(sample_ids.tolist(), question_ids.tolist()):
            clip = self.clip(tables, question_id, sample_id)
            if self.tokens is not None:
                mel, mask = self.tokens.clip(tables.pcm[clip], tables.names[clip]), tables.mel(clip)[1]
            else:
                mel, mask = self.spoken(tables, clip, sample_id)
            mels.append(mel)
            masks.append(mask)
        return sample_ids, question_ids, np.stack(mels), np.stack(masks)


class TextStage(Stage):
    """Map: ids -> question / caption tokens and masks, answer class and tokens, groups, modality flags."""

    def __init__(self, root, cfg: Config, split: str, epoch: int, modality: str, tokens=None) -> None:
        super().__init__(root, cfg, split, epoch, tokens)
        self.modality = modality
        self.cumulative_mix = np.cumsum(np.asarray(cfg.data.question_modality_mix, np.float64)).tolist()

    def __call__(self, sample_ids, question_ids, caption_ids, answer_ids):
        from mindvl.data.reading.augment import mask_tokens

        tables = self.tables
        tok = tables.tokenizer
        columns = defaultdict(list)
        for sample_id, qid, cid, aid in zip(sample_ids.tolist(), question_ids.tolist(), caption_ids.tolist(),
                                            answer_ids.tolist()):
            q_ids, q_mask = tables.question(qid)
            if self.augmenting and self.augment.token_mask > 0:
                q_ids = mask_tokens(q_ids, q_mask, self.augment.token_mask, tok.unk_id,
                                    {tok.pad_id, tok.cls_id, tok.sep_id},
                                    generator(self.seed, self.epoch, sample_id, TEXT))
            c_ids, c_mask = tables.caption(cid)
            use_text, use_audio = self._flags(sample_id)
            for name, value in (("question_ids", q_ids), ("question_mask", q_mask), ("caption_ids", c_ids),
                                ("caption_mask", c_mask), ("answer", np.int32(aid)),
                                ("answer_tokens", tables.answer_tokens(aid)), ("question_group", np.int32(qid)),
                                ("caption_group", np.int32(cid)), ("use_text", np.float32(use_text)),
                                ("use_audio", np.float32(use_audio))):
                columns[name].append(value)
            if self.tokens is not None:
                columns["question_tokens"].append(self.tokens.text(q_ids, q_mask, f"question {qid}"))
                columns["caption_tokens"].append(self.tokens.text(c_ids, c_mask, f"caption {cid}"))
        return (sample_ids, *(np.stack(columns[name]) for name in self.outputs))

    @property
    def outputs(self) -> Tuple[str, ...]:
        return _TEXT_OUTPUTS + (TOKEN_TEXT_OUTPUTS if self.tokens is not None else ())

    def _flags(self, sample_id: int) -> Tuple[float, float]:
        if self.modality != "mix":
            return _FLAGS[("text", "audio", "both").index(self.modality)]
        u = uniform(self.seed, self.epoch, sample_id, MODALITY)
        for flags, edge in zip(_FLAGS, self.cumulative_mix):
            if u < edge:
                return flags
        return _FLAGS[-1]


_TEXT_OUTPUTS = ("question_ids", "question_mask", "caption_ids", "caption_mask", "answer", "answer_tokens",
                 "question_group", "caption_group", "use_text", "use_audio")
TOKEN_TEXT_OUTPUTS = ("question_tokens", "caption_tokens")


class PackStage:
    """Map: the text, audio and modality columns -> the same columns and the packed layouts
    (mindvl/data/reading/packing.py); with cached encoder states only the fusion is packed (FUSION_COLUMNS)."""

    def __init__(self, packer: Packer, fusion_only: bool = False) -> None:
        self.packer = packer
        self.fusion_only = fusion_only

    @property
    def inputs(self) -> Tuple[str, ...]:
        return _FUSION_PACK_INPUTS if self.fusion_only else PACK_INPUTS

    @property
    def outputs(self) -> Tuple[str, ...]:
        return FUSION_COLUMNS if self.fusion_only else PACK_COLUMNS

    def __call__(self, *columns):  # self.inputs, in order
        packed = self.packer.fusion(*columns) if self.fusion_only else self.packer(*columns)
        return (*columns, *packed.arrays)


_FUSION_PACK_INPUTS = ("question_mask", "audio_mask", "use_text", "use_audio")  # FusionPacker's arguments
