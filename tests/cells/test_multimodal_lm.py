"""The generative multimodal model on a tiny decoder layout: a packed conversation computes what it computes
alone, the labelled-position head equals the full head there, the projectors' token budgets, and a short
real training run that lowers the loss and then generates the trained answers through the KV cache."""
from pathlib import Path

import numpy as np
import pytest

from mindvl.chat import ChatEncoder, chat_template, conversation_turns
from mindvl.config import (AudioConfig, DecoderConfig, ModelConfig, PreprocessConfig, ProjectorConfig,
                           VisionConfig)
from mindvl.data.reading.conversation_packing import ConversationPacker

TOKENIZER = Path(__file__).parents[1] / "references" / "tiny_gemma3_text" / "tokenizer.json"
PRE = PreprocessConfig(image_size=32, n_mels=16, max_audio_frames=32)
COLORS = {"red": (1, -1, -1), "green": (-1, 1, -1), "blue": (-1, -1, 1), "white": (1, 1, 1)}


def _config(**decoder):
    settings = dict(width=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp_ratio=2.0, vocab_size=384,
                    activation="gelu_tanh", qk_norm=True, embed_scale=8.0)
    settings.update(decoder)
    cfg = ModelConfig(vision=VisionConfig(patch_size=8, width=32, layers=1, heads=2),
                      audio=AudioConfig(width=32, layers=1, heads=2), decoder=DecoderConfig(**settings),
                      projector=ProjectorConfig(image_tokens=4, audio_tokens=4))
    cfg.validate()
    return cfg


def _chat(model):
    from tokenizers import Tokenizer

    return ChatEncoder(Tokenizer.from_file(str(TOKENIZER)), chat_template("plain"), model.image_tokens,
                       model.audio_tokens)


def _eval_model(seed):
    """A tiny MultimodalLM in PyNative inference mode, seeded, and its chat encoder."""
    import mindspore as ms

    from mindvl.cells.multimodal_lm import MultimodalLM

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(seed)
    model = MultimodalLM(_config(), PRE)
    model.set_train(False)
    return model, _chat(model)


def _square(color):
    image = np.full((3, 32, 32), -1.0, np.float32)
    image[:, 8:24, 8:24] = np.asarray(COLORS[color], np.float32)[:, None, None]
    return image


def _color_conversations(chat):
    return [chat.render(conversation_turns([{"from": "human", "value": "<image>\nWhat color is the shape?"},
                                            {"from": "gpt", "value": color}]), images=1) for color in COLORS]


def _tensors(packed):
    from mindspore import Tensor

    return [Tensor(a) for a in packed.arrays]


def test_token_budgets_pool_the_encoders():
    from mindvl.cells.multimodal_lm import pool_factor

    assert pool_factor(256, 64, square=True) == 2  # DINOv2 at 224 px: 16 x 16 patches -> 64
    assert pool_factor(64, 64, square=True) == 1
    assert pool_factor(128, 32, square=False) == 4  # Whisper over 256 frames -> 32 tokens
    assert pool_factor(36, 8, square=True) == 3
    with pytest.raises(ValueError, match="no pooling of 7 tokens fits 0"):
        pool_factor(7, 0, square=False)


def test_concat_merge_lays_each_block_of_patches_side_by_side():
    """projector.image_merge "concat": each 2 x 2 block's patch states, row by row, form one token's input (the
    projector reads 4 x the vision width); "mean" averages them."""
    import mindspore as ms
    from mindspore import Tensor

    from mindvl.cells.multimodal_lm import MultimodalLM

    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = _config()
    cfg.projector.image_merge = "concat"
    model = MultimodalLM(cfg, PRE)  # 4 x 4 patches of 8 px, 4 tokens: 2 x 2 blocks
    assert model.image_proj.fc1.weight.shape[1] == 4 * 32
    states = np.random.default_rng(0).standard_normal((1, 17, 32)).astype(np.float32)
    seen = []
    model.image_proj.construct = lambda x: seen.append(x.asnumpy()) or x
    model.image_states(Tensor(states))
    grid = states[0, 1:].reshape(4, 4, 32)
    want = np.stack([np.concatenate([grid[r + i, c + j] for i in (0, 1) for j in (0, 1)])
                     for r in (0, 2) for c in (0, 2)])
    np.testing.assert_array_equal(seen[0][0], want)
    with pytest.raises(Exception, match="model.projector.image_merge"):
        ProjectorConfig(image_merge="max").validate()


def test_packed_conversations_compute_what_they_compute_alone():
    """Three conversations sharing a row, with sliding-window layers whose window the prompts cross."""
    import mindspore as ms
    from mindspore import Tensor

    from mindvl.cells.multimodal_lm import MultimodalLM

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    model = MultimodalLM(_config(sliding_window=6, layer_types=["local", "global"]), PRE)
    model.set_train(False)
    chat = _chat(model)
    batch = _color_conversations(chat)[:3]
    rng = np.random.default_rng(0)
    images = rng.normal(size=(3, model.image_tokens, 64)).astype(np.float32)
    audio = np.zeros((3, model.audio_tokens, 64), np.float32)
    packed = ConversationPacker(128, [1], [16], model.image_tokens, model.audio_tokens)(batch)
    assert packed.segment.max() == 3
    together = model.from_states(*_tensors(packed)[2:], Tensor(images), Tensor(audio)).asnumpy()
    real = packed.label_weight > 0
    start = 0
    for b, sample in enumerate(batch):
        alone = ConversationPacker(len(sample), [1], [16], model.image_tokens, model.audio_tokens)([sample])
        logits = model.from_states(*_tensors(alone)[2:], Tensor(images[b:b + 1]), Tensor(audio[b:b + 1])).asnumpy()
        n = int(alone.label_weight.sum())
        # the packer lists labels row by row, conversations in their row's order
        seg = packed.segment.reshape(-1)[packed.label_index[real]]
        mine = np.flatnonzero(seg == seg[start])
        np.testing.assert_allclose(together[real][mine], logits[:n], atol=2e-5)
        start += n


def test_the_labelled_head_equals_every_position_logits_there():
    from mindspore import Tensor

    model, chat = _eval_model(seed=1)
    sample = chat.render(conversation_turns([{"from": "human", "value": "Say the colors"},
                                             {"from": "gpt", "value": "red green blue"}]))
    packed = ConversationPacker(len(sample), [1], [32], model.image_tokens, model.audio_tokens)([sample])
    zeros = Tensor(np.zeros((1, model.image_tokens, 64), np.float32)), Tensor(np.zeros((1, 4, 64), np.float32))
    at_labels = model.from_states(*_tensors(packed)[2:], *zeros).asnumpy()
    full = model.decoder(Tensor(sample.ids[None]), Tensor(np.ones((1, len(sample)), bool))).asnumpy()[0]
    real = packed.label_weight > 0
    np.testing.assert_allclose(at_labels[real], full[packed.label_index[real]], atol=2e-5)


def test_cached_encoder_states_and_fused_kernels_give_the_models_logits():
    """Training from the frozen encoders' cached states (TokenInputModel over construct_from_tokens) and with
    the fused CPU kernels (what lets batch 8 fit 8 GB in graph mode) computes the model's own logits."""
    from mindspore import Tensor

    from mindvl.cells.kernels import library, use_kernels
    from mindvl.cells.multimodal_model import TokenInputModel
    model, chat = _eval_model(seed=3)
    spoken = chat.render(conversation_turns([{"from": "human", "value": "<image>\n<audio>"},
                                             {"from": "gpt", "value": "red"}]), images=1, audios=1)
    samples = _color_conversations(chat)[:1] + [spoken]
    packed = ConversationPacker(96, [1, 2], [8], model.image_tokens, model.audio_tokens)(samples)
    rng = np.random.default_rng(0)
    image = Tensor(np.stack([_square("red"), _square("blue")]))
    mel = Tensor(rng.normal(size=(2, PRE.n_mels, PRE.max_audio_frames)).astype(np.float32))
    frame_mask = np.ones((2, PRE.max_audio_frames), np.float32)
    frame_mask[1, 20:] = 0  # the second clip shorter than the window
    frame_mask = Tensor(frame_mask)
    inputs = _tensors(packed)[2:]
    expected = model(*inputs, image, mel, frame_mask).asnumpy()
    vision_tokens, (audio_tokens, _, _) = model.vision(image)[0], model.audio(mel, frame_mask)
    cached = TokenInputModel(model)(*inputs, vision_tokens, audio_tokens, frame_mask).asnumpy()
    np.testing.assert_allclose(cached, expected, atol=1e-5)
    if library() is None:
        pytest.skip("no C++ compiler here: the fused kernels cannot be built")
    assert use_kernels(model, "fused") > 0
    np.testing.assert_allclose(model(*inputs, image, mel, frame_mask).asnumpy(), expected, atol=2e-4)


def test_training_lowers_the_loss_and_the_model_generates_the_trained_answers():
    """Graph mode: the image decides the answer; generation runs the prefill graph over the image and the
    decoder's cached decode steps, and stops at the template's turn end."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindvl.cells.multimodal_lm import MultimodalLM, MultimodalLMLoss
    from mindvl.generation.multimodal_generator import MultimodalGenerator, MultimodalPrompt

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(2)
    model = MultimodalLM(_config(sliding_window=64, layer_types=["global", "local"]), PRE)
    chat = _chat(model)
    packed = ConversationPacker(64, [4], [32], model.image_tokens, model.audio_tokens)(_color_conversations(chat))
    images = Tensor(np.stack([_square(c) for c in COLORS]))
    mel, frame_mask = Tensor(np.zeros((4, 16, 32), np.float32)), Tensor(np.zeros((4, 32), np.float32))
    step = nn.TrainOneStepCell(MultimodalLMLoss(model), nn.Adam(model.trainable_params(), learning_rate=3e-3))
    losses = [float(step(*_tensors(packed), images, mel, frame_mask).asnumpy()) for _ in range(150)]
    assert losses[-1] < 0.1 * losses[0], losses[::15]
    generator = MultimodalGenerator(model, chat.tokenizer, chat, PRE, cache_len=64)
    answers = generator.generate([MultimodalPrompt("What color is the shape?", _square(c)) for c in COLORS],
                                 max_new_tokens=6)
    assert [a.text for a in answers] == list(COLORS)
    assert all(a.finish == "stop" and a.tokens[-1] == chat.stop_id for a in answers)
