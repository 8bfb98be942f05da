"""The serving memory bound under a hostile run: a real `mindvl serve` process with its default limits, legit
clients throughout, and for the middle phase attackers alongside them.

Over a classifier package (`--package`), legit clients ask `predict`; the attackers dribble request heads a
byte a second, open connections past the limit, declare bodies of 1 GB and never send them, label bodies gzip
that are not, send 170,000 instances over REST and 100,000 over gRPC, PNGs whose header claims 20000x20000
pixels, and real 4096x4096 images back to back.

Over a generative package (`--generative-package`, issue 48), legit clients ask the OpenAI API about an image
(greedy, so each answer must equal the one it got alone: a changed answer counts as a failure); the attackers
send what once hurt every other client: NaN and infinite settings (OpenAI's JSON and an fp32 NaN over gRPC),
non-integral and non-boolean values, a stop string of 120,000 characters, 16,000 "[EOS]" in a question, 8 MB
of words, a WAV declaring 1 Hz for an hour, a 1 x 16,000,000-pixel PNG, JSON nested 100,000 deep, a lone
surrogate, a negative seed (valid: answered).

One run prints, per phase, the legit clients' throughput, p99 and failures, the server's RSS (sampled every
50 ms, and its VmHWM), the rise over the baseline against the stated bound (docs/serving.md, *Limits and
hardening*), the attackers' answers by kind, and whether /health still answers.

    python benchmarks/serving_hostile.py [--package PKG] [--generative-package PKG] [--data mindvl_data]
                                         [--seconds 30] [--clients 8] [--generative-clients 16]
                                         [--slow-clients 200] [--image-clients 8] [--attack-rate 4] [--json OUT]
"""
import argparse
import asyncio
import base64
import collections
import io
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

os.environ.setdefault("GLOG_v", "3")

MB = 2 ** 20


def memory_bound_mb(config) -> float:
    """What clients can make the server hold above its loaded versions, as docs/serving.md states it."""
    return (3 * config.max_inflight_mb + 2 * config.max_inflight_mb + 8 * config.max_request_mb
            + config.decode_slots * 4096 * 4096 * 8 / MB + config.max_connections * 0.75)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) / 1024


def png_claiming(width: int, height: int) -> bytes:
    """A small real PNG whose header (IHDR, CRC fixed) claims width x height pixels."""
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def png_of(width: int, height: int) -> bytes:
    """A real width x height PNG (noise in a corner, so it is not a trivial image; compresses small)."""
    from PIL import Image

    image = Image.new("RGB", (width, height), (30, 120, 200))
    image.paste(Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def predict_body(image: bytes, question: str = "what shape is it?") -> bytes:
    instance = {"image": {"b64": base64.b64encode(image).decode()}, "question": question, "audio": {"b64": ""}}
    return json.dumps({"instances": [instance]}).encode()


class Tally:
    """Answers by (attack, what came back), shared by the attacker threads."""

    def __init__(self) -> None:
        self.counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.lock = threading.Lock()

    def add(self, attack: str, outcome: str) -> None:
        with self.lock:
            self.counts[attack][outcome] += 1


def attack(kind: str, port: int, grpc_target: str, seconds: float, slow_clients: int, image_clients: int,
           attack_rate: float, results) -> None:
    """The attackers of a `kind` ("vqa", "vlm") run for `seconds`, in a process of their own (their threads would
    otherwise take the legit clients' GIL); their answers by kind go back through `results`."""
    tally, stop = Tally(), threading.Event()
    threads = attackers(port, grpc_target, stop, tally, slow_clients, image_clients) if kind == "vqa" \
        else generative_attackers(port, grpc_target, stop, tally, attack_rate)
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=90)
    results.put({name: dict(kinds) for name, kinds in tally.counts.items()})


def answer_kind(reply: bytes) -> str:
    """'HTTP <status>: <first words of error_msg>' of a raw HTTP reply, or 'closed' when there was none."""
    if not reply:
        return "closed"
    status = reply.split(b" ", 2)[1].decode(errors="replace") if reply.startswith(b"HTTP/") else "?"
    found = re.search(rb'"(?:error_msg|message)":\s*"([^"]{0,60})', reply)
    return f"HTTP {status}: {found.group(1).decode(errors='replace')}" if found else f"HTTP {status}"


def raw(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head + body)
        reply = b""
        try:
            while chunk := connection.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply:
                    length = re.search(rb"Content-Length: (\d+)", reply, re.I)
                    if length and len(reply.split(b"\r\n\r\n", 1)[1]) >= int(length.group(1)):
                        break
        except (socket.timeout, ConnectionResetError):
            pass
        return reply


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n").encode()


def looping(attack: str, send, stop: threading.Event, tally: Tally, rate: float = 0.0) -> threading.Thread:
    """A thread sending `attack` again and again until `stop` (at most `rate` a second; 0: back to back), tallying
    what comes back."""
    def run():
        while not stop.is_set():
            start = time.perf_counter()
            try:
                tally.add(attack, send())
            except OSError as error:
                tally.add(attack, type(error).__name__)
                time.sleep(0.05)
            if rate:
                stop.wait(max(0.0, 1 / rate - (time.perf_counter() - start)))
    return threading.Thread(target=run, name=attack, daemon=True)


def attackers(port: int, grpc_target: str, stop: threading.Event, tally: Tally, slow_clients: int,
              image_clients: int) -> List[threading.Thread]:
    """The classifier's attack threads (started by the caller); each loops until `stop`."""
    def loop(attack, send):
        return looping(attack, send, stop, tally)

    huge_instances = json.dumps({"instances": [{"text": "x"}] * 170_000}).encode()
    claiming = predict_body(png_claiming(20000, 20000))
    big_image = predict_body(png_of(4096, 4096))
    bad_gzip = b"this is not gzip" * 64

    def slow_head():  # a head dribbled a byte a second: the server cuts it off after --header-timeout-s
        with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
            connection.sendall(b"POST /model/vqa:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            try:
                while not stop.is_set():
                    connection.sendall(b"X")
                    stop.wait(1.0)
                    connection.setblocking(False)
                    try:
                        return answer_kind(connection.recv(4096))  # the 408, or b"": closed
                    except BlockingIOError:  # nothing yet: dribble on
                        pass
                    finally:
                        connection.setblocking(True)
            except OSError:
                return "closed"
            return "stopped"

    def flood():  # 64 connections at once, on top of the slow heads: those past the limit get 503
        sockets = []
        try:
            for _ in range(64):
                sockets.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            time.sleep(0.2)
            kinds = []
            for connection in sockets:
                connection.setblocking(False)
                try:
                    kinds.append(answer_kind(connection.recv(4096)))
                except BlockingIOError:
                    kinds.append("held open")
            for kind in kinds[:-1]:
                tally.add("connection flood", kind)
            return kinds[-1]
        finally:
            for connection in sockets:
                connection.close()

    def grpc_instances():
        import grpc

        from mindvl.serving import grpc_protocol as G

        request = G.PredictRequest(servable_spec=G.ServableSpec(name="vqa", method_name="embed_text"))
        request.instances.extend([G.Instance()] * 100_000)
        with grpc.insecure_channel(grpc_target) as channel:
            reply = G.predict_stub(channel)(request, timeout=30)
        return "gRPC: " + (reply.error_msg[0].error_msg.decode()[:60] if reply.error_msg else "answered")

    threads = [loop("slow head", slow_head) for _ in range(slow_clients)]
    threads += [loop("connection flood", flood),
                loop("1 GB declared, never sent", lambda: answer_kind(raw(port, post_head("/model/vqa:predict", 2 ** 30)))),
                loop("bad gzip", lambda: answer_kind(raw(port, post_head("/model/vqa:embed_text", len(bad_gzip),
                                                                           "Content-Encoding: gzip\r\n"), bad_gzip))),
                loop("170,000 instances", lambda: answer_kind(raw(port, post_head("/model/vqa:embed_text",
                                                                                    len(huge_instances)), huge_instances))),
                loop("100,000 gRPC instances", grpc_instances),
                loop("PNG claiming 20000x20000", lambda: answer_kind(raw(port, post_head("/model/vqa:predict",
                                                                                           len(claiming)), claiming)))]
    threads += [loop("4096x4096 PNG", lambda: answer_kind(raw(port, post_head("/model/vqa:predict", len(big_image)),
                                                              big_image, timeout=120)))
                for _ in range(image_clients)]
    return threads


def wav_of(samples: np.ndarray, rate: int) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def chat_body(content, **settings) -> bytes:
    """A /v1/chat/completions body (NaN and Infinity written as JavaScript's literals, as clients can)."""
    return json.dumps({"model": "vlm", "messages": [{"role": "user", "content": content}], **settings}).encode()


def generative_attackers(port: int, grpc_target: str, stop: threading.Event, tally: Tally,
                         rate: float) -> List[threading.Thread]:
    """The generative server's attack threads (issue 48), one per attack, each sending it `rate` times a second
    (0: back to back) until `stop`."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    question = "what color is the shape?"
    bodies = {
        "NaN temperature": chat_body(question, temperature=float("nan")),
        "NaN repetition_penalty": chat_body(question, repetition_penalty=float("nan")),
        "max_tokens Infinity": chat_body(question, max_tokens=float("inf")),
        "max_tokens 1e400": b'{"model": "vlm", "max_tokens": 1e400, "messages": [{"role": "user", "content": "hi"}]}',
        "max_tokens 1.5": chat_body(question, max_tokens=1.5),
        "temperature Infinity": chat_body(question, temperature=float("inf")),
        "stream \"no\"": chat_body(question, stream="no"),
        "seed -1 (valid)": chat_body(question, seed=-1, temperature=1.0, max_tokens=8),
        "JSON nested 100,000 deep": b'{"model": "vlm", "messages": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        "stop of 120,000 characters": chat_body(question, stop=["x" * 120000], max_tokens=64),
        "16,000 [EOS] in the question": chat_body("[EOS] " * 16000),
        "8 MB of words": chat_body("word " * (8 * MB // 5)),
        "a lone surrogate": b'{"model": "vlm", "messages": [{"role": "user", "content": "red \\ud800?"}]}',
        "WAV declaring 1 Hz for an hour": chat_body([{"type": "input_audio", "input_audio": {
            "data": b64(wav_of(np.zeros(3600, np.int16), 1)), "format": "wav"}}]),
        "1 x 16,000,000-pixel PNG": chat_body([{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + b64(png_of(1, 16_000_000))}}, {"type": "text", "text": question}]),
    }

    def post(body):
        return lambda: answer_kind(raw(port, post_head("/v1/chat/completions", len(body)), body, timeout=120))

    def grpc_nan():
        import grpc

        from mindvl.serving import grpc_protocol as G

        request = G.instances_to_request("vlm", "generate", 0, [{"text": question, "temperature": np.float32("nan")}])
        with grpc.insecure_channel(grpc_target) as channel:
            try:
                list(G.predict_stream_stub(channel)(request, timeout=60))
            except grpc.RpcError as error:
                return f"gRPC {error.code().name}: {error.details()[:60]}"
        return "gRPC: answered"

    return [looping(name, post(body), stop, tally, rate) for name, body in bodies.items()] + \
        [looping("fp32 NaN temperature over gRPC", grpc_nan, stop, tally, rate)]


Request = Tuple[str, bytes, Callable[[dict], Optional[str]]]  # path, body, what makes its answer a failure


def vqa_requests(examples) -> List[Request]:
    """`predict` of each example; a failure: any error_msg."""
    def check(answer):
        failed = answer.get("error_msg") or next((i["error_msg"] for i in answer["instances"] if "error_msg" in i), None)
        return str(failed)[:60] if failed else None
    return [("/model/vqa:predict", predict_body(e.image, e.question), check) for e in examples]


async def vlm_requests(session, url: str, examples) -> List[Request]:
    """The OpenAI API asked about each example's image, greedy: a failure is an error, or an answer other than
    the one it got alone (asked here, one at a time, before any load)."""
    requests = []
    for example in examples:
        body = chat_body([{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(example.image).decode()}},
            {"type": "text", "text": example.question}], max_tokens=16)
        async with session.post(f"{url}/v1/chat/completions", data=body) as reply:
            alone = (await reply.json(content_type=None))["choices"][0]["message"]["content"]

        def check(answer, alone=alone):
            if "error" in answer:
                return answer["error"]["message"][:60]
            return None if answer["choices"][0]["message"]["content"] == alone else "a greedy answer changed"
        requests.append(("/v1/chat/completions", body, check))
    return requests


async def legit(session, url: str, requests: List[Request], clients: int, seconds: float) -> Dict[str, float]:
    """Closed-loop clients on the session's kept-alive connections for `seconds`: throughput, p99, failures."""
    import aiohttp

    latencies, errors, stop_at = [], collections.Counter(), time.perf_counter() + seconds

    async def client(session, index):
        turn = index
        while time.perf_counter() < stop_at:
            path, body, check = requests[turn % len(requests)]
            start = time.perf_counter()
            try:
                async with session.post(f"{url}{path}", data=body) as reply:
                    failed = check(await reply.json(content_type=None))
                if failed:
                    errors[failed] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as error:
                errors[type(error).__name__] += 1
            latencies.append(time.perf_counter() - start)
            turn += clients

    started = time.perf_counter()
    await asyncio.gather(*(client(session, i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    return {"requests": len(latencies), "throughput": len(latencies) / elapsed,
            "p99_ms": float(np.percentile(np.asarray(latencies) * 1000, 99)) if latencies else float("nan"),
            "errors": dict(errors)}


async def phases(kind: str, pid: int, url: str, grpc_target: str, port: int, examples, bound: float, clients: int,
                 args):
    """Quiet, under attack, after: the legit clients keep their connections throughout (opened in the warm-up),
    as a served application's clients would; -> (rows, baseline RSS)."""
    import multiprocessing

    import aiohttp

    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        requests = vqa_requests(examples) if kind == "vqa" else await vlm_requests(session, url, examples)
        await legit(session, url, requests, clients, 3.0)  # warm-up: connections open, batch buckets met
        baseline = rss_mb(pid)
        print(f"server pid {pid}: RSS {baseline:.0f} MB once serving; stated bound above it: {bound:.0f} MB", flush=True)
        for phase in ("quiet", "under attack", "after"):
            samples, sampling = [], threading.Event()

            def sample():
                while not sampling.is_set():
                    samples.append(rss_mb(pid))
                    sampling.wait(0.05)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            attacker = context.Process(target=attack, args=(kind, port, grpc_target, args.seconds, args.slow_clients,
                                                             args.image_clients, args.attack_rate, results)) \
                if phase == "under attack" else None
            if attacker is not None:
                attacker.start()
                await asyncio.sleep(3.0)  # the attackers' process starts and opens its connections
            result = await legit(session, url, requests, clients, args.seconds - (3.0 if attacker else 0.0))
            attacks = await asyncio.get_running_loop().run_in_executor(None, results.get) if attacker else {}
            if attacker is not None:
                attacker.join()
            sampling.set()
            sampler.join()
            health = raw(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            row = {"phase": phase, **result, "rss_peak_mb": max(samples), "rss_end_mb": samples[-1],
                   "over_baseline_mb": max(samples) - baseline, "health": answer_kind(health), "attacks": attacks}
            rows.append(row)
            print(f"{phase}: legit {row['throughput']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, failures "
                  f"{row['errors'] or 0}; server RSS peak {row['rss_peak_mb']:.0f} MB (+{row['over_baseline_mb']:.0f} "
                  f"over the baseline; bound {bound:.0f}), at the end +{row['rss_end_mb'] - baseline:.0f}; "
                  f"/health {row['health']}", flush=True)
            for name, kinds in attacks.items():
                print(f"    {name}: " + ", ".join(f"{count} x {kind}" for kind, count in
                                                sorted(kinds.items(), key=lambda item: -item[1])), flush=True)
    return rows, baseline


def _traceback_ends(log: List[str]):
    """The exception line ending each traceback in a log, with the message logged before it."""
    for number, line in enumerate(log):
        if line.startswith("Traceback"):
            end = next((later for later in log[number + 1:] if not later.startswith((" ", "\t"))), "?")
            yield f"{log[number - 1].strip()[-80:] if number else ''} | {end.strip()[:100]}"


def served(kind: str, package: str, examples, bound: float, clients: int, args) -> dict:
    """One run of the three phases against a real `mindvl serve` over `package` (servable `kind`)."""
    from mindvl.serving.servable import deploy

    print(f"\n== {kind}: {package}, {clients} legit clients", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        deploy(package, Path(folder), kind)
        command = [sys.executable, "-m", "mindvl.cli", "serve", "--servable-dir", folder, "--port", "0",
                   "--grpc-port", "0", "--poll-s", "0"]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log = []
        try:
            for line in server.stdout:
                found = re.search(r"REST (http://\S+?),? gRPC (\S+?);", line)
                if found:
                    url, grpc_target = found.group(1).rstrip(",;"), found.group(2)
                    break
            else:
                raise SystemExit("mindvl serve ended before listening")
            threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()  # its log, kept
            port = int(url.rsplit(":", 1)[1])
            rows, baseline = asyncio.run(phases(kind, server.pid, url, grpc_target, port, examples, bound, clients,
                                                args))
            high_water = rss_mb(server.pid, "VmHWM")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    tracebacks = collections.Counter(_traceback_ends(log))
    print(f"\nserver VmHWM {high_water:.0f} MB = baseline {baseline:.0f} + {high_water - baseline:.0f} MB "
          f"(bound {bound:.0f} MB); tracebacks in its log: {sum(tracebacks.values())}")
    for end, count in tracebacks.most_common(5):
        print(f"    {count} x {end}")
    print("\n| phase | legit req/s | legit p99 (ms) | legit failures | server RSS peak (MB) | over baseline (MB) | "
          "at the end (MB) | bound (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['phase']} | {row['throughput']:.1f} | {row['p99_ms']:.0f} | {sum(row['errors'].values())} | "
              f"{row['rss_peak_mb']:.0f} | {row['over_baseline_mb']:.0f} | {row['rss_end_mb'] - baseline:.0f} | "
              f"{bound:.0f} |")
    return {"package": str(package), "baseline_mb": baseline, "bound_mb": bound, "vmhwm_mb": high_water,
            "tracebacks": dict(tracebacks), "rows": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", help="a model package with the vqa graph (mindvl export)")
    parser.add_argument("--generative-package", help="a generative model package (mindvl export of a vlm run)")
    parser.add_argument("--data", default="mindvl_data", help="data set whose test split supplies the legit requests")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--clients", type=int, default=8, help="legit closed-loop predict clients")
    parser.add_argument("--generative-clients", type=int, default=16, help="legit closed-loop OpenAI API clients")
    parser.add_argument("--slow-clients", type=int, default=200, help="connections dribbling a request head")
    parser.add_argument("--image-clients", type=int, default=8, help="clients sending 4096x4096 PNGs back to back")
    parser.add_argument("--attack-rate", type=float, default=4.0,
                        help="each generative attack sent this many times a second (0: back to back, a flood: what "
                             "a refused request costs in CPU is a rate limiter's to bound)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if not args.package and not args.generative_package:
        parser.error("give --package, --generative-package or both")

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind
    from mindvl.data.reading.examples import query_examples
    from mindvl.serving.serve_config import ServeConfig

    print(f"machine: {cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores", flush=True)
    examples = query_examples(args.data, 64)
    defaults = ServeConfig(servable_dir=".")
    bound = memory_bound_mb(defaults)
    print(f"limits: max_inflight_mb {defaults.max_inflight_mb:g}, max_request_mb {defaults.max_request_mb:g}, "
          f"decode_slots {defaults.decode_slots}, max_connections {defaults.max_connections} -> bound {bound:.0f} MB",
          flush=True)
    runs = {}
    if args.package:
        runs["vqa"] = served("vqa", args.package, examples, bound, args.clients, args)
    if args.generative_package:
        runs["vlm"] = served("vlm", args.generative_package, examples[:16], bound, args.generative_clients, args)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
