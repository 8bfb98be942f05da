"""One LoRA training step of the generative multimodal model on this CPU: compile time, step time, samples/s
and peak memory per batch size, each batch in a process of its own (its own peak resident memory).

    python benchmarks/vlm_step.py --vision DIR --audio DIR --decoder DIR [--batches 1,8] [--length 256]
                                  [--kernels standard,fused] [--encoders graph,cached]
                                  [--image-size 224] [--lora-rank 8] [--steps 3] [--threads 2]

DIRs: the folders `mindvl convert dinov2`, `mindvl convert whisper-base` and `mindvl convert llm` write
(Gemma 3 270M from the registry's GGUF). The step is stage 2's: encoders and decoder frozen, projectors and
LoRA on the decoder's q and v trained (AdamWeightDecay), graph mode, float32. A batch is `batch`
conversations in the Gemma template — typed and spoken questions with one-word answers and descriptions,
an image each (64 tokens at 224 px), a 2.56 s clip for every third (32 tokens) — packed into rows of
--length tokens, labels only on the answers. Images and mel are random: speed and memory do not depend on
the pixels. Goal (issue 24): batch >= 8 within 8 GB peak RSS.

--kernels compares MindSpore's standard operators with mindvl's fused CPU kernels (train.kernels: fused):
in graph mode on the CPU the standard operators' intermediates cost ~3.5x more memory per packed row
(profiled: the decoder's q/k norms and rotations alone keep ~10x their output size alive), so the kernels
decide whether batch 8 fits. --encoders cached trains from the frozen encoders' states computed once
(model.pretrained.cache, MultimodalLM.construct_from_tokens), graph runs them inside the step.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

QUESTIONS = ["What color is the shape?", "Is there a circle in the image?", "What shape is in the image?",
             "Describe the image."]
ANSWERS = ["blue", "yes", "rectangle", "A blue rectangle on a white background."]


def run_batch(args) -> dict:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn
    from tokenizers import Tokenizer

    from mindvl.cells.kernels import use_kernels
    from mindvl.cells.multimodal_lm import MultimodalLMLoss
    from mindvl.cells.multimodal_model import TokenInputModel
    from mindvl.chat import ChatEncoder, chat_template, conversation_turns
    from mindvl.config import load_config
    from mindvl.data.reading.conversation_packing import ConversationPacker
    from mindvl.model_factory import create_model

    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    cfg = load_config("pretrained-s", [
        f"preprocess.image_size={args.image_size}", "model.pretrained.text=''", "data.tokenizer=''",
        f"model.pretrained.vision={args.vision}", f"model.pretrained.audio={args.audio}",
        f"model.pretrained.decoder={args.decoder}", f"model.decoder.lora_rank={args.lora_rank}",
        "model.pretrained.cache=''"])
    start = time.perf_counter()
    model = create_model(cfg)
    build_s = time.perf_counter() - start
    chat = ChatEncoder(Tokenizer.from_file(str(Path(args.decoder) / "tokenizer.json")), chat_template("gemma"),
                       model.image_tokens, model.audio_tokens)
    samples = []
    for i in range(args.batch):
        spoken = i % 3 == 2
        question = "<image>\n" + ("<audio>" if spoken else QUESTIONS[i % 4])
        turns = conversation_turns([{"from": "human", "value": question}, {"from": "gpt", "value": ANSWERS[i % 4]}])
        samples.append(chat.render(turns, 1, int(spoken)))
    packed = ConversationPacker(args.length, range(1, args.batch + 1), [16, 32, 64, 128, 256, 512],
                                model.image_tokens, model.audio_tokens)(samples)
    rng = np.random.default_rng(0)
    pre = cfg.preprocess
    use_kernels(model, args.kernels)
    image = Tensor(rng.normal(size=(args.batch, 3, pre.image_size, pre.image_size)).astype(np.float32))
    mel = Tensor(rng.normal(size=(args.batch, pre.n_mels, pre.max_audio_frames)).astype(np.float32))
    frame_mask = Tensor(np.ones((args.batch, pre.max_audio_frames), np.float32))
    net, encode_s = model, 0.0
    if args.encoders == "cached":  # the states the token cache would hold, computed here once
        start = time.perf_counter()
        model.vision.set_train(False)
        model.audio.set_train(False)
        image, mel = Tensor(model.vision(image)[0].asnumpy()), Tensor(model.audio(mel, frame_mask)[0].asnumpy())
        encode_s = time.perf_counter() - start
        net = TokenInputModel(model)
    inputs = [Tensor(a) for a in packed.arrays] + [image, mel, frame_mask]
    step = nn.TrainOneStepCell(MultimodalLMLoss(net), nn.AdamWeightDecay(model.trainable_params(), 1e-4))
    start = time.perf_counter()
    first_loss = float(step(*inputs).asnumpy())
    first_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(*inputs).asnumpy()
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    return {"kernels": args.kernels, "encoders": args.encoders, "encode_s": round(encode_s, 1),
            "loss": round(first_loss, 4), "batch": args.batch, "rows": packed.shape[0], "length": args.length, "labels": packed.shape[2],
            "fill": round(packed.fill, 3), "trainable": int(sum(p.size for p in model.trainable_params())),
            "build_s": round(build_s, 1), "first_step_s": round(first_s, 1), "step_s": round(step_s, 2),
            "samples_s": round(args.batch / step_s, 2),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("vision", "audio", "decoder"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--kernels", default="standard,fused", help="train.kernels values to compare")
    parser.add_argument("--encoders", default="graph", help="graph (encoders in the step), cached, or both")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # a child process running one batch size
    args = parser.parse_args(argv)
    if args.batch:
        print("RESULT " + json.dumps(run_batch(args)), flush=True)
        return

    from mindvl.cells.kernels.machine import describe

    print(f"machine: {describe(os.environ.get('MINDVL_KERNEL_ARCH', 'native'))}; {args.threads} threads")
    rows = []
    for encoders in args.encoders.split(","):
        for kernels in args.kernels.split(","):
            for batch in [int(b) for b in args.batches.split(",")]:
                command = [sys.executable, __file__, "--batch", str(batch), "--vision", args.vision, "--audio",
                           args.audio, "--decoder", args.decoder, "--length", str(args.length), "--image-size",
                           str(args.image_size), "--lora-rank", str(args.lora_rank), "--steps", str(args.steps),
                           "--threads", str(args.threads), "--kernels", kernels, "--encoders", encoders]
                done = subprocess.run(command, capture_output=True, text=True)
                result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode or not result:
                    print(f"{kernels} {encoders} batch {batch}: failed ({done.returncode}): "
                          f"{done.stderr.strip().splitlines()[-1:]}")
                    continue
                rows.append(json.loads(result[-1][len("RESULT "):]))
                print(f"  done: {rows[-1]}", flush=True)
    print(f"\nLoRA step (r{args.lora_rank} on q, v; projectors), rows of {args.length} tokens, image {args.image_size} px")
    print(f"{'kernels':>8} {'encoders':>8} {'batch':>5} {'rows x len':>10} {'labels':>6} {'fill':>5} "
          f"{'compile+1st s':>13} {'step s':>7} {'samples/s':>9} {'peak RSS GB':>11} {'loss':>7}")
    for row in rows:
        print(f"{row['kernels']:>8} {row['encoders']:>8} {row['batch']:>5} {row['rows']:>4} x {row['length']:<3} "
              f"{row['labels']:>6} {row['fill']:>5.2f} {row['first_step_s']:>13.1f} {row['step_s']:>7.2f} "
              f"{row['samples_s']:>9.2f} {row['peak_rss_gb']:>11.2f} {row['loss']:>7.3f}")
    print("(the same loss in a column pair: the kernels change memory and speed, not the result)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
