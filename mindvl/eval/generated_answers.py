"""The generative model judged by what it writes: VQA accuracy of its generated answers (normalised exact
match) for typed and for spoken questions, per answer kind, and the quality of its image descriptions
(BLEU-4 and CIDEr-D, pycocoevalcap's scorers, the COCO caption evaluation's), on a split's conversations.

Every answer is generated greedily through the chat template, exactly as a user would prompt the model
(mindvl.generation.multimodal_generator): the image, the question as typed text or as a clip, the opened assistant
turn. A spoken test question is heard in a voice training never heard: its clip is the one the loader
reads for that conversation (mindvl.data.reading.stages.Stage.clip). The majority baseline over the same typed
questions stands next to it, so a number can be read at a glance.
"""
from __future__ import annotations

import re
import string
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Tuple

from mindvl import preprocess as P
from mindvl.chat import recipe_chat
from mindvl.config import Config
from mindvl.data.conversation_samples import ConversationSample, read_conversation_table
from mindvl.data.reading.conversation_loader import conversation_rows
from mindvl.data.reading.stages import Stage
from mindvl.eval.vqa import answer_kind
from mindvl.progress import progress_bar

ANSWER_TOKENS, CAPTION_TOKENS = 8, 32  # new tokens a generated answer / description may take
# prompts generated at once: a large decoder's graphs hold memory per prompt (vlm-s's evaluation with the fused
# kernels: 7.3 GB at 16, 5.2 GB at 8, in the same time on 2 cores), a small one's time goes to per-step overhead
BATCH, LARGE_DECODER_BATCH, LARGE_DECODER = 16, 8, 100_000_000
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalise_answer(text: str) -> str:
    """VQA's answer normalisation, in short: lower case, punctuation and articles dropped, spaces collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def caption_scores(references: Dict[int, List[str]], candidates: Dict[int, str]) -> Dict[str, float]:
    """BLEU-4 and CIDEr-D of `candidates` against `references` (id -> texts), lower-cased and without
    punctuation (the PTB tokenizer's effect for these plain captions, without its Java)."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    refs = {i: [normalise_caption(r) for r in texts] for i, texts in references.items()}
    cands = {i: [normalise_caption(candidates[i])] for i in refs}
    bleu, _ = Bleu(4).compute_score(refs, cands, verbose=0)
    cider, _ = Cider().compute_score(refs, cands)
    return {"bleu4": round(float(bleu[3]), 4), "cider_d": round(float(cider), 4)}


def normalise_caption(text: str) -> str:
    return " ".join(text.lower().translate(_PUNCTUATION).split())


class GenerativeEvaluator:
    """Evaluates a MultimodalLM (trained or loaded) on a recipe's conversations; built once per model, so its
    prefill and decode graphs compile once for every validation of a training run. `kernels`: the
    generator's (MultimodalGenerator): "standard" keeps a training model's own, "fused" for a loaded model
    (what `mindvl eval` and the quickstart use: with MindSpore's operators 16 prompts of vlm-s need ~25 GB)."""

    def __init__(self, cfg: Config, model=None, batch_size: int = 0, kernels: str = "standard",
                 generator=None) -> None:
        """batch_size 0: BATCH prompts at once, LARGE_DECODER_BATCH over a decoder of more than LARGE_DECODER
        parameters. `generator`: generates instead of a MultimodalGenerator over `model` (a model package's
        graphs: mindvl/deploy/evaluate_package.py); it has `.chat` and `.generate(prompts, max_new_tokens)`."""
        self.cfg = cfg
        if generator is not None:
            self.chat, self.generator = generator.chat, generator
            self.batch_size = int(batch_size) or BATCH
            return
        large = sum(int(p.size) for p in model.decoder.get_parameters()) > LARGE_DECODER
        self.batch_size = int(batch_size) or (LARGE_DECODER_BATCH if large else BATCH)
        cache_len = int(self.cfg.data.packing.length) + CAPTION_TOKENS
        if cfg.model.is_native:  # images at their own resolution; spoken questions where model.native.audio
            from mindvl.generation.native_generator import NativeGenerator

            self.generator = NativeGenerator.from_run(cfg, model, cache_len, kernels)
            self.chat = self.generator.layout.chat
            return
        from mindvl.generation.multimodal_generator import MultimodalGenerator

        self.chat = recipe_chat(cfg, model.image_tokens, model.audio_tokens)
        self.generator = MultimodalGenerator(model, self.chat.tokenizer, self.chat, cfg.preprocess, cache_len=cache_len,
                                             kernels=kernels)

    @property
    def modalities(self) -> Tuple[Tuple[str, str], ...]:
        """(modality, conversation kind) of the questions it asks: typed, and spoken where the model hears."""
        hears = not self.cfg.model.is_native or self.cfg.model.native.audio
        return (("text", "vqa"), ("audio", "spoken")) if hears else (("text", "vqa"),)

    def evaluate(self, split: str = "test", captions: bool = True, progress: bool = True,
                 limit: int = 0) -> Dict[str, Any]:
        """{"vqa_text", "vqa_audio" (a model that hears): accuracy, accuracy_<kind>, count; "caption": bleu4, cider_d, count,
        examples; "baseline": the majority answer and its accuracy on the typed questions; "seconds"}.
        `limit` > 0: only the split's first `limit` typed questions, spoken questions and descriptions (a
        bounded look, as the quickstart of a pretrained decoder takes; 0: all)."""
        start = time.perf_counter()
        chosen = self._chosen(split)
        stage = Stage(Path(self.cfg.data.root), self.cfg, split, 0)
        report: Dict[str, Any] = {}
        for modality, kind in self.modalities:
            items = [(row, s) for row, s in chosen if s.kind == kind][:limit or None]
            answers = self._generate([self._prompt(stage, row, s) for row, s in items], ANSWER_TOKENS,
                                     f"eval {split} ({modality})", progress)
            report[f"vqa_{modality}"] = _vqa_scores([s.turns[1].parts[0] for _, s in items], answers)
        typed = [s for _, s in chosen if s.kind == "vqa"][:limit or None]
        report["baseline"] = majority_answer(self._training(), typed)
        if captions:
            items = [(row, s) for row, s in chosen if s.kind == "caption"][:limit or None]
            written = self._generate([self._prompt(stage, row, s) for row, s in items], CAPTION_TOKENS,
                                     f"eval {split} (captions)", progress)
            references = {i: [s.turns[1].parts[0]] for i, (_, s) in enumerate(items)}
            report["caption"] = {**caption_scores(references, dict(enumerate(written))), "count": len(items),
                                 "examples": [{"reference": s.turns[1].parts[0], "generated": text}
                                              for (_, s), text in list(zip(items, written))[:3]]}
        report["seconds"] = round(time.perf_counter() - start, 1)
        return report

    def questions(self, split: str, count: int) -> List[Tuple[ConversationSample, Any]]:
        """The split's first `count` questions, alternately typed and spoken (where the model hears), each with its
        prompt."""
        chosen = self._chosen(split)
        kinds = (tuple(kind for _, kind in self.modalities) * count)[:count]
        pools = {kind: iter([(row, s) for row, s in chosen if s.kind == kind]) for kind in set(kinds)}
        stage = Stage(Path(self.cfg.data.root), self.cfg, split, 0)
        return [(sample, self._prompt(stage, row, sample)) for row, sample in
                (next(pools[kind], (None, None)) for kind in kinds) if sample is not None]

    def _chosen(self, split: str) -> List[Tuple[int, ConversationSample]]:
        """(row, sample) of the split's conversations that evaluation uses."""
        samples = read_conversation_table(self.cfg.data.root, "test" if split == "test" else "train")
        rows = set(conversation_rows(self.cfg, split).tolist())
        return [(row, s) for row, s in enumerate(samples) if row in rows]

    def _training(self) -> List[ConversationSample]:
        return [s for _, s in self._chosen("train")]

    def _prompt(self, stage: Stage, row: int, sample: ConversationSample):
        """The sample's first user turn as a user would send it: the image, the typed question or the clip."""
        from mindvl.generation.multimodal_generator import MultimodalPrompt

        question = "".join(part for part in sample.turns[0].parts if isinstance(part, str)).strip()
        heard = None
        if sample.question_id >= 0:
            tables = stage.tables
            heard = tables.mel(stage.clip(tables, sample.question_id, row))
        if self.cfg.model.is_native:  # the images as they are: the generator cuts each at its own resolution
            return self.generator.prompt(question, [_picture(data, f"conversation {sample.id} image {i}")
                                                    for i, data in enumerate(sample.images)], audio=heard)
        image = P.decode_image(sample.image, self.cfg.preprocess, name=f"conversation {sample.id} image")
        return MultimodalPrompt("", image, *heard) if heard is not None else MultimodalPrompt(question, image)

    def _generate(self, prompts: list, max_new_tokens: int, what: str, progress: bool) -> List[str]:
        texts: List[str] = []
        for start in progress_bar(range(0, len(prompts), self.batch_size), desc=what, disable=not progress, leave=False):
            batch = prompts[start:start + self.batch_size]
            texts += [answer.text for answer in self.generator.generate(batch, max_new_tokens=max_new_tokens)]
        return texts


def _picture(data: bytes, name: str):
    """An encoded image as an RGB PIL image, or InputError naming it."""
    import io

    from PIL import Image, UnidentifiedImageError

    from mindvl.errors import InputError

    try:
        with Image.open(io.BytesIO(data)) as picture:
            return picture.convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise InputError(f"{name}: not a readable image ({exc})") from exc


def _vqa_scores(expected: List[str], generated: List[str]) -> Dict[str, float]:
    hits: Dict[str, List[bool]] = defaultdict(list)
    for want, got in zip(expected, generated):
        hit = normalise_answer(got) == normalise_answer(want)
        hits["all"].append(hit)
        hits[answer_kind(normalise_answer(want))].append(hit)
    result = {"accuracy": sum(hits["all"]) / max(len(hits["all"]), 1), "count": len(expected)}
    result.update({f"accuracy_{kind}": sum(v) / len(v) for kind, v in sorted(hits.items()) if kind != "all"})
    return result


def majority_answer(training: List[ConversationSample], evaluated: List[ConversationSample]) -> Dict[str, Any]:
    """The most frequent answer of the training split's typed questions, and its accuracy on `evaluated`."""
    counts: Counter = Counter(normalise_answer(s.turns[1].parts[0]) for s in training if s.kind == "vqa")
    majority = max(counts, key=counts.get) if counts else ""
    hits = [normalise_answer(s.turns[1].parts[0]) == majority for s in evaluated]
    return {"answer": majority, "accuracy": sum(hits) / max(len(hits), 1)}


def evaluate_generative(cfg: Config, model, progress: bool = True, split: str = "test",
                        limit: int = 0) -> Dict[str, Any]:
    """`mindvl eval` for a generative run (a loaded model: mindvl's fused CPU kernels)."""
    return GenerativeEvaluator(cfg, model, kernels="fused").evaluate(split, progress=progress, limit=limit)

