"""VQA accuracy of the answer classifier and of the generated answer text, per question modality."""
import weakref
from collections import Counter
from typing import Callable, Dict, Sequence

import mindspore as ms
import numpy as np

from mindvl.config import Config
from mindvl.data import create_dataset, load_meta, load_tokenizer
from mindvl.data.reading.splits import split_rows
from mindvl.data.records import read_split
from mindvl.progress import progress_bar

ANSWER_KINDS = {"yes": "yes/no", "no": "yes/no", "circle": "shape", "rectangle": "shape", "triangle": "shape"}


def answer_kind(answer: str) -> str:
    return ANSWER_KINDS.get(answer, "colour")


def greedy_decode(generate_net, inputs: Sequence[ms.Tensor], tokenizer, answer_length: int) -> np.ndarray:
    """Generate answer token ids with the causal LM head: (B, answer_length - 1), one graph call a token,
    stopping early once every row has produced [EOS]."""
    batch = inputs[0].shape[0]
    tokens = np.full((batch, answer_length - 1), tokenizer.pad_id, dtype=np.int32)
    tokens[:, 0] = tokenizer.bos_id
    generated = np.full((batch, answer_length - 1), tokenizer.pad_id, dtype=np.int32)
    finished = np.zeros(batch, dtype=bool)
    for position in range(answer_length - 1):
        logits = generate_net(*inputs, ms.Tensor(tokens)).asnumpy()  # (B, La-1, vocab)
        next_token = np.where(finished, tokenizer.pad_id, logits[:, position].argmax(-1)).astype(np.int32)
        generated[:, position] = next_token
        finished |= next_token == tokenizer.eos_id
        if finished.all():
            break
        if position + 1 < answer_length - 1:
            tokens[:, position + 1] = next_token
    return generated


def majority_baseline(cfg: Config, split: str = "test") -> Dict[str, object]:
    """Accuracy on `split` ("test" or "validation") of always answering the most frequent training answer
    (training rows only: held-out validation images excluded)."""
    answers = load_meta(cfg.data.root)["answers"]

    def counts(name: str) -> Counter:
        table = read_split(cfg.data.root, "test" if name == "test" else "train", ["answer_id"])
        return Counter(int(table[i]["answer_id"]) for i in split_rows(cfg, name))

    train, evaluated = counts("train"), counts(split)
    majority = max(train, key=train.get)
    accuracy = evaluated[majority] / max(sum(evaluated.values()), 1)
    return {"answer": answers[majority], "accuracy": accuracy}


_NETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def vqa_nets(model):
    """(answer, generate, encode) graphs over `model`, built once per model: a graph compiles once per
    input shape and cell, so text and spoken questions, every validation during training and every
    checkpoint loaded into the same model share the compilations."""
    from mindvl.cells import EncodeNet, StateAnswerNet, StateGenerateNet

    if model not in _NETS:
        _NETS[model] = (StateAnswerNet(model), StateGenerateNet(model), EncodeNet(model))
    return _NETS[model]


def vqa_accuracy(cfg: Config, model, modality: str, progress: bool = True, tokens=None,
                 split: str = "test") -> Dict[str, float]:
    """Accuracy over `split` ("test", or "validation": the training images held out by
    data.validation_fraction) with questions given as `modality` ("text", "audio" or "both").

    The encoders run once per batch (EncodeNet), or not at all when `tokens` (EncoderTokens filled for
    that split; a cache filled for "train" covers "validation" too) holds their states; the fusion then
    answers and decodes from those states."""
    tokenizer = load_tokenizer(cfg.data.root)
    answer_net, generate_net, encode_net = vqa_nets(model)

    def predict(batch):
        if tokens is None:
            states = encode_net(*(ms.Tensor(batch[name]) for name in
                                  ("image", "question_ids", "question_mask", "audio_mel", "audio_mask")))
        else:
            states = [ms.Tensor(batch[name]) for name in ("image_tokens", "question_tokens", "audio_tokens")]
        image_tokens, question_tokens, audio_tokens = states
        inputs = [image_tokens, question_tokens, ms.Tensor(batch["question_mask"]), audio_tokens,
                  *(ms.Tensor(batch[name]) for name in ("audio_mask", "use_text", "use_audio"))]
        return (answer_net(*inputs).asnumpy().argmax(-1),
                greedy_decode(generate_net, inputs, tokenizer, cfg.preprocess.max_answer_length))

    return score_vqa(cfg, predict, modality, progress, tokens, split)


def score_vqa(cfg: Config, predict: Callable, modality: str, progress: bool = True, tokens=None,
              split: str = "test") -> Dict[str, float]:
    """Accuracy of `predict(batch) -> (answer ids (B,), generated token ids (B, L))` over `split` with
    questions as `modality`, overall, for the generated text, and per answer kind. Any predictor: the
    model's graphs (vqa_accuracy) or a package's exported VQA graph (mindvl.deploy.evaluate_package)."""
    answers = load_meta(cfg.data.root)["answers"]
    tokenizer = load_tokenizer(cfg.data.root)
    # the whole split on every rank, also under msrun (evaluation during data-parallel training)
    dataset = create_dataset(cfg, split, question_modality=modality, tokens=tokens, shard_id=0, num_shards=1)
    correct, generated_correct, total = 0, 0, 0
    per_kind_correct, per_kind_total = Counter(), Counter()
    iterator = dataset.create_dict_iterator(num_epochs=1, output_numpy=True)
    for batch in progress_bar(iterator, total=dataset.get_dataset_size(), desc=f"eval vqa {split} ({modality})",
                      disable=not progress, leave=False):
        predicted, generated = predict(batch)
        hits = predicted == batch["answer"]
        for row, answer_id in enumerate(batch["answer"]):
            kind = answer_kind(answers[answer_id])
            per_kind_total[kind] += 1
            per_kind_correct[kind] += int(hits[row])
            generated_correct += int(tokenizer.decode(generated[row]) == answers[answer_id])
        correct += int(hits.sum())
        total += len(hits)
    result = {"accuracy": correct / max(total, 1), "generated_accuracy": generated_correct / max(total, 1),
              "count": total}
    result.update({f"accuracy_{kind}": per_kind_correct[kind] / per_kind_total[kind] for kind in sorted(per_kind_total)})
    return result
